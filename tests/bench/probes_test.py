"""The benchmarks docs/performance.md quotes, end to end and small, each on clusters it starts
itself from TANDEM_BIN_DIR: bench/tpot_prediction.py (its rounds, the calibrated step model, a row
per kind of stream) and bench/slo_goodput.py (a sweep per policy, the comparison, slo's
prediction errors)."""
import json
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


def test_slo_goodput_sweeps_two_policies_and_compares_them(tmp_path):
    """bench/slo_goodput.py at one low rate with two policies and two arrival seeds: each sweep
    gets its own `tandem up` and the same workload; the pooled table, the ratio line and slo's
    prediction errors are printed, and each sweep's result JSON holds every request."""
    bin_dir = os.environ.get("TANDEM_BIN_DIR")
    assert bin_dir, "TANDEM_BIN_DIR must name the folder with tandem and its workers"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "slo_goodput.py"), "--bin", bin_dir, "--rates", "2",
         "--num-requests", "6", "--seeds", "2", "--policies", "round_robin,slo",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=500)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    out = result.stdout
    table = out[out.index("slo_goodput: SLO attainment"):]
    assert re.search(r"^round_robin\s+\d+%", table, re.MULTILINE), table
    assert re.search(r"^slo\s+\d+%", table, re.MULTILINE), table
    assert "slo / best other:" in table, table
    assert "(means over 2 arrival seeds)" in table, table
    # slo's prediction errors pool both seeds' requests.
    assert re.search(r"slo prediction error over (\d+) requests, median \|error\|: TTFT \d+%",
                     table), table
    assert int(re.search(r"slo prediction error over (\d+) requests", table).group(1)) > 6, table
    for policy in ("round_robin", "slo", "round_robin.seed2", "slo.seed2"):
        data = json.loads((tmp_path / f"{policy}.json").read_text())
        requests = data["runs"][0]["rates"][0]["requests"]
        assert len(requests) == 6, requests
    slo_requests = json.loads((tmp_path / "slo.json").read_text())["runs"][0]["rates"][0]["requests"]
    assert any(r.get("predicted_tpot_ms") for r in slo_requests if r.get("ok")), slo_requests
    for png in ("attainment_by_policy.png", "slo_predictions.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    # --replot summarizes the same results again and redraws the figures, running nothing.
    (tmp_path / "attainment_by_policy.png").unlink()
    replot = [sys.executable, str(ROOT / "bench" / "slo_goodput.py"), "--replot", "--seeds", "2",
              "--policies", "round_robin,slo"]
    again = subprocess.run([*replot, "--out", str(tmp_path)], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, f"stdout:\n{again.stdout}\nstderr:\n{again.stderr}"
    assert "tandem up" not in again.stdout, again.stdout
    assert again.stdout[again.stdout.index("slo_goodput: SLO attainment"):] == table, again.stdout
    assert (tmp_path / "attainment_by_policy.png").exists()
    empty = tmp_path / "empty"
    missing = subprocess.run([*replot, "--out", str(empty)], capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 2 and "round_robin.json does not exist" in missing.stderr, (
        missing.stderr)


def test_slo_goodput_alone_over_a_duration_prints_its_errors(tmp_path):
    """slo alone, arrivals for a fixed time at each rate (a sustained rate rather than a fixed
    burst): each rate sends what its Poisson arrivals in that time give, and slo's prediction
    errors are printed with no other policy to compare."""
    bin_dir = os.environ.get("TANDEM_BIN_DIR")
    assert bin_dir, "TANDEM_BIN_DIR must name the folder with tandem and its workers"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "slo_goodput.py"), "--bin", bin_dir,
         "--rates", "2,4", "--duration", "3", "--policies", "slo", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    table = result.stdout[result.stdout.index("slo_goodput: SLO attainment"):]
    assert "slo / best other:" not in table, table
    assert re.search(r"slo prediction error over \d+ requests, median \|error\|: TTFT \d+%",
                     table), table
    rates = json.loads((tmp_path / "slo.json").read_text())["runs"][0]["rates"]
    counts = [len(r["requests"]) for r in rates]
    # Poisson arrivals over 3 s: about 6 and 12; the higher rate sends more (not a fixed count).
    assert 1 <= counts[0] < counts[1] <= 30, counts
