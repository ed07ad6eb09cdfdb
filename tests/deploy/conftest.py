"""The deploy tests import the namespace harness (tests/netns) and cluster_common (tests/cluster)."""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "cluster"))
sys.path.insert(0, str(HERE.parent / "netns"))
sys.path.insert(0, str(HERE))


def pytest_configure(config):
    if "s" not in config.option.reportchars and "a" not in config.option.reportchars:
        config.option.reportchars += "s"
