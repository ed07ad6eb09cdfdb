"""The load generator's tests import it from <repo>/bench (as `tandem bench` runs it)."""
import os
import pathlib
import sys

ROOT = pathlib.Path(os.environ.get("TANDEM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(ROOT / "bench"))
