"""bench/tpot_prediction.py end to end, small: it starts its own cluster (from TANDEM_BIN_DIR), runs
its rounds and prints, for each pause, the calibrated step model and a row per kind of stream
with the median predicted and observed TPOT and the median error."""
import os
import re
import subprocess
import sys

from conftest import ROOT


def test_tpot_prediction_runs_and_reports_both_kinds():
    bin_dir = os.environ.get("TANDEM_BIN_DIR")
    assert bin_dir, "TANDEM_BIN_DIR must name the folder with tandem-router and tandem-decode"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "tpot_prediction.py"), "--bin", bin_dir,
         "--rounds", "2", "--context-words", "60", "--pause", "0"],
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    out = result.stdout
    assert "pause 0 s between batches; calibrated step model:" in out, out
    assert "us/decode context token" in out and "us/prompt context token" in out, out
    rows = {m.group(1): [float(x) for x in m.groups()[1:]] for m in re.finditer(
        r"^(long|short)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%$", out, re.MULTILINE)}
    assert set(rows) == {"long", "short"}, out
    for predicted, observed, error in rows.values():
        # Predictions of the right size (the slo policy predicted them) and real timings.
        assert 0 < predicted < 10_000 and 0 < observed < 10_000, out
        assert error == round(error), out


def test_tpot_prediction_refuses_bad_arguments():
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "tpot_prediction.py"),
                             "--rounds", "1"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--rounds must be >= 2" in result.stderr, result.stderr
