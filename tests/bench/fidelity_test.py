"""bench/sim_fidelity.py's arithmetic on hand-made files: the differences it prints, the pooled
rows, the simulated cluster it writes and the step factors it measures. (The comparison itself
runs real clusters for minutes: docs/sim.md, "Fidelity".)"""
import argparse
import json

import pytest

import sim_fidelity as fid


def result_json(path, points):
    """A bench result JSON with one run whose rates have these (rate, met, requests, goodput)."""
    rates = [{"rate": rate, "summary": {
        "slo_attainment": met / n, "slo_met": met, "requests": n, "goodput": goodput,
        "ttft_ms": {"p50": 100.0 + rate}, "tpot_ms": {"p50": 10.0 + rate}}}
        for rate, met, n, goodput in points]
    path.write_text(json.dumps({"runs": [{"rates": rates}]}))


def args_for(tmp_path, policies=(), repeats=1):
    return argparse.Namespace(out=tmp_path, policies=list(policies), repeats=repeats, seed=1)


def runs(*policies, repeats=1):
    return fid.runs_of(args_for(None, policies, repeats))


def test_differences_in_points_and_percent(tmp_path):
    result_json(tmp_path / "real-round_robin.json", [(1.0, 20, 40, 2.0), (2.0, 10, 40, 0.0)])
    result_json(tmp_path / "sim-round_robin.json", [(1.0, 22, 40, 2.3), (2.0, 12, 40, 0.5)])
    rows = fid.compare(args_for(tmp_path), runs("round_robin"), "profile")
    assert [r["rate"] for r in rows] == [1.0, 2.0]
    # 50% real, 55% simulated: +5 pp (within); goodput 2.0 -> 2.3: +15% (not within).
    assert rows[0]["attainment_diff_pp"] == pytest.approx(5.0)
    assert rows[0]["goodput_diff_pct"] == pytest.approx(15.0)
    assert rows[0]["within"] is False
    # No real goodput: no percentage, and the point is judged on attainment alone (+5 pp).
    assert rows[1]["goodput_diff_pct"] is None
    assert rows[1]["within"] is True


def test_pooled_rows_count_every_request(tmp_path):
    result_json(tmp_path / "real-round_robin.json", [(1.0, 30, 40, 1.0)])
    result_json(tmp_path / "sim-round_robin.json", [(1.0, 40, 40, 1.0)])
    result_json(tmp_path / "real-slo.json", [(1.0, 10, 20, 3.0)])
    result_json(tmp_path / "sim-slo.json", [(1.0, 10, 20, 2.0)])
    rows = fid.compare(args_for(tmp_path), runs("round_robin", "slo"), "profile")
    (p,) = fid.pooled(rows)
    # 40 of 60 real, 50 of 60 simulated: +16.7 pp; goodput means 2.0 and 1.5: -25%.
    assert p["real_attainment"] == pytest.approx(40 / 60)
    assert p["sim_attainment"] == pytest.approx(50 / 60)
    assert p["attainment_diff_pp"] == pytest.approx(100 / 6)
    assert p["goodput_diff_pct"] == pytest.approx(-25.0)
    assert p["policy"] == "round_robin+slo"
    assert p["key"] == "round_robin+slo"


def test_repeats_have_their_own_seeds_and_files_and_pool_per_policy(tmp_path):
    r = runs("round_robin", "slo", repeats=3)
    a1, a2, a3, b1, b2, b3 = r
    assert [x.key for x in (a1, a2, a3, b1)] == ["round_robin.1", "round_robin.2",
                                                "round_robin.3", "slo.1"]
    assert [x.seed for x in (a1, a2, a3, b3)] == [1, 2, 3, 3]
    assert fid.workload_flags(argparse.Namespace(
        rates="6", num_requests=200, input_len=128, output_len=32, ttft_slo_ms=300,
        tpot_slo_ms=40), a3.seed)[-2:] == ["--seed", "3"]
    # round_robin: 10, 20 and 30 of 100 met real (goodput 1, 2, 3), 20 every time simulated.
    for run, met in zip((a1, a2, a3), (10, 20, 30)):
        result_json(tmp_path / f"real-{run.key}.json", [(6.0, met, 100, met / 10)])
        result_json(tmp_path / f"sim-{run.key}.json", [(6.0, 20, 100, 2.0)])
    for run in (b1, b2, b3):
        result_json(tmp_path / f"real-{run.key}.json", [(6.0, 90, 100, 5.0)])
        result_json(tmp_path / f"sim-{run.key}.json", [(6.0, 80, 100, 4.0)])
    rows = fid.compare(args_for(tmp_path), r, "profile")
    # Alone, the first repeat is off by +10 pp and +100%; pooled, round_robin agrees exactly.
    assert rows[0]["key"] == "round_robin.1" and rows[0]["within"] is False
    rr, slo = fid.repeats_pooled(rows)
    assert rr["key"] == "round_robin (3 runs)" and slo["key"] == "slo (3 runs)"
    assert rr["real_attainment"] == pytest.approx(0.2) and rr["sim_attainment"] == pytest.approx(0.2)
    assert rr["goodput_diff_pct"] == pytest.approx(0.0) and rr["within"] is True
    assert slo["attainment_diff_pp"] == pytest.approx(-10.0) and slo["within"] is False
    assert slo["goodput_diff_pct"] == pytest.approx(-20.0)


PROFILE_STEP = {"base_seconds": 0.01, "prefill_token_seconds": 0.001, "decode_token_seconds": 0.002,
                "context_token_seconds": 1e-6, "prompt_context_token_seconds": 2e-6}


def write_profile(path, kv_bytes):
    path.write_text(json.dumps({"format": "tandem-profile-v1", "step": PROFILE_STEP,
                                "kv_bytes_per_token": kv_bytes}))


def test_step_ratios_use_the_profiles_step_model(tmp_path):
    write_profile(tmp_path / "profile-slo-decode-0.json", 23040)
    steps = [
        # 0.01 + 0.001 * 32 + 2e-6 * 528 = 0.043056 s predicted; measured twice that.
        {"batch_size": 1, "prefill_tokens": 32, "decode_tokens": 0, "decode_context": 0,
         "prompt_context": 528, "seconds": 0.086112},
        # 0.01 + 0.002 * 2 + 1e-6 * 300 = 0.0143 s predicted; measured half.
        {"batch_size": 2, "prefill_tokens": 0, "decode_tokens": 2, "decode_context": 300,
         "prompt_context": 0, "seconds": 0.00715},
        # A step that did nothing is not a step.
        {"batch_size": 0, "prefill_tokens": 0, "decode_tokens": 0, "decode_context": 0,
         "prompt_context": 0, "seconds": 0.5},
    ]
    (tmp_path / "steps-slo-decode-0.jsonl").write_text(
        "".join(json.dumps(s) + "\n" for s in steps))
    ratios = fid.step_ratios(args_for(tmp_path), "slo", ["decode-0", "prefill-0"])
    assert ratios == pytest.approx([0.5, 2.0])


def test_quantiles_are_the_midpoints_of_equal_shares():
    assert fid.quantiles(list(range(10)), 20) == list(range(10))
    assert fid.quantiles(list(range(100)), 4) == [12, 37, 62, 87]


def test_the_simulated_cluster_mirrors_tandem_up(tmp_path):
    write_profile(tmp_path / "profile-kv_aware-decode-0.json", 23040)
    write_profile(tmp_path / "profile-kv_aware-prefill-0.json", None)
    (tmp_path / "steps-kv_aware-decode-0.jsonl").write_text(json.dumps(
        {"batch_size": 1, "prefill_tokens": 0, "decode_tokens": 1, "decode_context": 0,
         "prompt_context": 0, "seconds": 0.024}) + "\n")
    workers = ["decode-0", "prefill-0"]
    (run,) = runs("kv_aware")
    plain = json.loads(fid.cluster_json(args_for(tmp_path), run, workers, "profile").read_text())
    # tandem sim's name for kv_aware; one pool per role, the decode worker's KV size for both.
    assert plain == {"policy": "prefix", "pools": [
        {"role": "prefill", "count": 1, "profile": "profile-kv_aware-prefill-0.json",
         "kv_bytes_per_token": 23040},
        {"role": "decode", "count": 1, "profile": "profile-kv_aware-decode-0.json",
         "kv_bytes_per_token": 23040}]}
    factors = json.loads(fid.cluster_json(args_for(tmp_path), run, workers, "factors").read_text())
    # 0.024 s measured against 0.01 + 0.002 predicted.
    assert factors["step_factors"] == [2.0]
    assert factors["pools"] == plain["pools"]
