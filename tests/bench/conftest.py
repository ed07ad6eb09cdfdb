"""The load generator's tests import it from <repo>/bench (as `tandem bench` runs it); the
`profile` fixture shared by the simulator's tests."""
import json
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(os.environ.get("TANDEM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(ROOT / "bench"))


@pytest.fixture
def profile(tmp_path, request):
    """profile.json in tmp_path holding the test module's PROFILE (a worker profile)."""
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(request.module.PROFILE))
    return path
