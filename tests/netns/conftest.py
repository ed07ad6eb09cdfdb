"""The namespace tests import the harness beside them and cluster_common from tests/cluster, and
say why they skip (no root, no `ip netns`) in the summary ctest shows."""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "cluster"))
sys.path.insert(0, str(HERE))


def pytest_configure(config):
    if "s" not in config.option.reportchars and "a" not in config.option.reportchars:
        config.option.reportchars += "s"
