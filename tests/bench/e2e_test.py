"""`tandem bench` end to end: small sweeps against clusters that it starts itself with `tandem up`
(from TANDEM_BIN_DIR), over both protocols, and an A/B comparison of aggregated against 1 prefill
+ 1 decode. Checks the result JSON (every request, with sane timings and the server's token
counts), the workers' prefix-cache counters, the PNG plots, and that each cluster was stopped."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

PNG = b"\x89PNG\r\n\x1a\n"
OUTPUT_LEN = 8


@pytest.fixture(scope="module")
def bin_dir():
    path = os.environ.get("TANDEM_BIN_DIR")
    assert path, "TANDEM_BIN_DIR must name the folder with tandem, tandem-router, tandem-decode"
    assert os.access(os.path.join(path, "tandem"), os.X_OK), f"{path}/tandem is missing"
    return path


def bench(bin_dir, *args, timeout=240):
    """Runs `python -m tandem_bench ARGS` the way `tandem bench ARGS` does."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "bench"), TANDEM_BIN_DIR=bin_dir)
    result = subprocess.run([sys.executable, "-m", "tandem_bench", *args], capture_output=True,
                            text=True, env=env, timeout=timeout)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def check_request(r, protocol):
    assert r["ok"], r["error"]
    assert r["output_tokens"] == OUTPUT_LEN and r["output_tokens_source"] == "usage"
    assert r["finish_reason"] == "length"  # ignore_eos: exactly max_tokens
    assert r["prompt_tokens"] >= r["requested_input_tokens"]
    assert 0 < r["ttft_ms"] < r["e2e_ms"] < 60_000
    assert r["tpot_ms"] == pytest.approx((r["e2e_ms"] - r["ttft_ms"]) / (OUTPUT_LEN - 1))
    if protocol == "grpc":
        # One gap per token after the first; they add up to the stream's duration after the first.
        assert len(r["itl_ms"]) == OUTPUT_LEN - 1
        assert sum(r["itl_ms"]) <= r["e2e_ms"] - r["ttft_ms"] + 1e-6
        assert r["decode_worker"] and r["server_ttft_ms"] > 0
    else:
        assert 1 <= len(r["itl_ms"]) + 1 <= OUTPUT_LEN
    assert all(x >= 0 for x in r["itl_ms"])


@pytest.mark.parametrize("protocol,endpoint", [("openai", "completions"), ("grpc", "chat")])
def test_sweep_on_a_cluster_it_starts(bin_dir, tmp_path, protocol, endpoint):
    log = tmp_path / "cluster.log"
    result = bench(bin_dir, "--up", "aggregated worker_kv_cache_mb=64", "--protocol", protocol,
                   "--endpoint", endpoint, "--rates", "2,4", "--num-requests", "5",
                   "--input-len", "24", "--output-len", str(OUTPUT_LEN), "--slo-scale", "5",
                   "--unloaded-requests", "2", "--seed", "11",
                   # Measured, not sent: the router's admission may refuse requests whose targets
                   # it predicts to miss, and this test wants every request answered.
                   "--no-send-slo",
                   "--result-json", str(tmp_path / "result.json"),
                   "--plot-dir", str(tmp_path / "plots"), "--cluster-log", str(log),
                   "--no-progress")
    assert "TTFT p50 (ms)" in result.stdout and "SLO attainment (%)" in result.stdout
    assert "DistServe goodput" in result.stdout
    data = json.loads((tmp_path / "result.json").read_text())
    [run] = data["runs"]
    assert run["protocol"] == protocol and run["up_flags"] == ["--aggregated",
                                                               "--worker_kv_cache_mb=64"]
    assert list(run["worker_metrics"]) == ["decode-0"]
    unloaded = run["unloaded"]
    assert unloaded["failed"] == 0 and unloaded["ttft_ms"] > 0 and unloaded["tpot_ms"] > 0
    targets = data["slo_scale_targets"]
    assert targets["ttft_ms"] == pytest.approx(5 * unloaded["ttft_ms"])
    assert targets["tpot_ms"] == pytest.approx(5 * unloaded["tpot_ms"])
    assert [p["rate"] for p in run["rates"]] == [2.0, 4.0]
    for point in run["rates"]:
        records = point["requests"]
        assert [r["index"] for r in records] == list(range(5))
        for r in records:
            check_request(r, protocol)
            assert (r["ttft_slo_ms"], r["tpot_slo_ms"]) == (targets["ttft_ms"], targets["tpot_ms"])
            assert r["met_slo"] == (r["ttft_ms"] <= r["ttft_slo_ms"] and r["tpot_ms"] <= r["tpot_slo_ms"])
        s = point["summary"]
        assert s["completed"] == 5 and s["failed"] == 0
        assert s["output_tokens"] == 5 * OUTPUT_LEN
        assert s["slo_attainment"] == sum(r["met_slo"] for r in records) / 5
        assert s["ttft_ms"]["p50"] <= s["ttft_ms"]["p90"] <= s["ttft_ms"]["p99"]
        # The decode worker's Prometheus counters saw exactly this rate's prompts.
        hit = point["prefix_hit"]
        assert hit["workers"]["decode-0"]["prompt_tokens"] == sum(r["prompt_tokens"] for r in records)
        assert 0 <= hit["rate"] <= 1
    assert run["distserve_goodput"]["bound"] in ("interpolated", "at_least", "below_range")
    for name in ("latency_cdf.png", "latency_vs_rate.png", "attainment_vs_rate.png"):
        assert (tmp_path / "plots" / name).read_bytes().startswith(PNG)
    # The cluster was stopped with SIGTERM (`tandem up` says so when it gets one).
    assert "stopping the cluster" in log.read_text()


def test_ab_aggregated_against_disaggregated(bin_dir, tmp_path):
    log = tmp_path / "cluster.log"
    result = bench(bin_dir, "--up", "worker_kv_cache_mb=64", "--ab", "aggregated", "",
                   "--protocol", "grpc", "--rate", "4", "--num-requests", "4",
                   "--shared-prefix", "2,2,48", "--input-len", "8",
                   "--output-len", str(OUTPUT_LEN), "--result-json", str(tmp_path / "ab.json"),
                   "--cluster-log", str(log), "--no-progress")
    assert "A: aggregated" in result.stdout and "B: default" in result.stdout
    assert "B/A" in result.stdout and "prefix hit rate, workers (%)" in result.stdout
    a, b = json.loads((tmp_path / "ab.json").read_text())["runs"]
    assert a["up_flags"] == ["--worker_kv_cache_mb=64", "--aggregated"]
    assert b["up_flags"] == ["--worker_kv_cache_mb=64"]
    assert sorted(a["worker_metrics"]) == ["decode-0"]
    assert sorted(b["worker_metrics"]) == ["decode-0", "prefill-0"]
    ra, rb = a["rates"][0]["requests"], b["rates"][0]["requests"]
    # The same seeded workload on both sides: the same schedule and the same prompts.
    assert [r["scheduled_s"] for r in ra] == [r["scheduled_s"] for r in rb]
    assert [(r["prefix_group"], r["prompt_tokens"]) for r in ra] == \
        [(r["prefix_group"], r["prompt_tokens"]) for r in rb]
    for r in ra + rb:
        check_request(r, "grpc")
    # Two groups of two prompts share a 48-token system prompt: the second of each group hits the
    # cache (3 full blocks) on both sides.
    for run in (a, b):
        assert run["rates"][0]["prefix_hit"]["rate"] > 0
    assert log.read_text().count("stopping the cluster") == 2
