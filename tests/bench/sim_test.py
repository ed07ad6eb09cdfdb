"""`tandem sim`'s Python side (bench/tandem_bench/sim.py): the trace it writes from tandem bench's
workload flags, cluster.json from flags, reading results back into a real run's records, and the
tables, result JSON and plots. The simulator here is tests/bench/fake_tandem_sim.py, a stand-in
that honours the file contract with a crude model (it says nothing about a cluster); the real
tandem_sim (sim/) drops in through TANDEM_BIN_DIR / --bin."""
import json
import os
import pathlib
import stat
import sys

import pytest

from cli_test import FakeServerThread
from tandem_bench import cli, report, sim, workload

HERE = pathlib.Path(__file__).resolve().parent
PNG = b"\x89PNG\r\n\x1a\n"

PROFILE = {"format": "tandem-profile-v1", "model": "test", "engine": "test", "source": "measured",
           "step": {"base_seconds": 0.01, "prefill_token_seconds": 0.0002,
                    "decode_token_seconds": 0.0005, "context_token_seconds": 1e-8,
                    "prompt_context_token_seconds": 1e-8},
           "kv_bytes_per_token": 65536, "block_size": 16, "kv_blocks": 1024, "max_running": 32,
           "token_budget": 256}


@pytest.fixture
def bin_dir(tmp_path):
    """A folder whose tandem_sim runs the fake."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "tandem_sim"
    script.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{HERE / 'fake_tandem_sim.py'}' \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def run_sim(capsys, *args):
    code = sim.main([str(a) for a in args])
    assert code == 0
    return capsys.readouterr().out


def parse(*args):
    parser = sim.build_parser()
    return parser.parse_args([str(a) for a in args])


# ------------------------------------------------------------------------------------------------
# The trace.
# ------------------------------------------------------------------------------------------------


def test_trace_says_what_the_workload_is(tmp_path):
    config = workload.WorkloadConfig(
        input_lengths=workload.Lengths(16), output_lengths=workload.Lengths(8),
        shared_prefix=workload.SharedPrefix(2, 3, 40),
        slo_classes=(workload.SloClass("chat", 1, ttft_ms=300, priority=2),
                     workload.SloClass("batch", 1, tpot_ms=80)),
        tenants=(workload.Tenant("a", 1),))
    specs = workload.build(config, 5, 12)
    times = [0.1 * i for i in range(12)]
    lines = [json.loads(x) for x in sim.trace_lines(specs, times)]
    assert [x["id"] for x in lines] == [f"r{i}" for i in range(12)]
    assert [x["arrival_s"] for x in lines] == times
    for x, spec in zip(lines, specs):
        # The shared part is the group's system prompt: 40 tokens, the same for its requests.
        assert x["prefix_group"] == f"g{spec.prefix_group}" and x["prefix_tokens"] == 40
        assert x["prompt_tokens"] == 40 + 16 and x["output_tokens"] == 8
        assert x["tenant"] == "a" and x["slo_class"] in ("chat", "batch")
        if x["slo_class"] == "chat":
            assert x["ttft_slo_ms"] == 300 and "tpot_slo_ms" not in x and x["priority"] == 2
        else:
            assert x["tpot_slo_ms"] == 80 and "ttft_slo_ms" not in x and x["priority"] == 0
    assert {x["prefix_group"] for x in lines} == {"g0", "g1"}


def test_trace_without_shared_prefix_has_no_group():
    config = workload.WorkloadConfig(input_lengths=workload.Lengths(10, 0.5))
    specs = workload.build(config, 0, 20)
    lines = [json.loads(x) for x in sim.trace_lines(specs, [0.0] * 20)]
    assert all(x["prefix_group"] is None and x["prefix_tokens"] is None for x in lines)
    assert [x["prompt_tokens"] for x in lines] == [s.input_len for s in specs]
    assert all(5 <= x["prompt_tokens"] <= 15 for x in lines)


# ------------------------------------------------------------------------------------------------
# cluster.json from flags.
# ------------------------------------------------------------------------------------------------


def test_cluster_from_flags(profile):
    c = sim.cluster_from_flags(parse("--profile", profile, "--prefill_workers", "2",
                                     "--decode-workers", "3", "--policy", "prefix",
                                     "--kv-blocks", "99", "--fail", "30:d1",
                                     "--link-bandwidth-gbps", "25"))
    assert c["policy"] == "prefix"
    assert [(p["role"], p["count"]) for p in c["pools"]] == [("prefill", 2), ("decode", 3)]
    for pool in c["pools"]:
        assert pool["profile"] == PROFILE  # inlined
        # Flags beat the profile's settings; the rest come from it.
        assert (pool["kv_blocks"], pool["block_size"], pool["max_running"],
                pool["token_budget"], pool["max_prefill_tokens"]) == (99, 16, 32, 256, 0)
    assert c["failures"] == [{"at_s": 30.0, "worker": "d1"}]
    assert c["links"] == {"bandwidth_gbps": 25.0, "latency_us": 50.0}
    aggregated = sim.cluster_from_flags(parse("--profile", profile, "--aggregated",
                                              "--decode-workers", "4"))
    assert [(p["role"], p["count"]) for p in aggregated["pools"]] == [("both", 4)]
    assert aggregated["policy"] == "slo"


@pytest.mark.parametrize("args,message", [
    ([], "--profile FILE"),
    (["--profile", "{p}", "--decode-workers", "0"], "--decode-workers must be >= 1"),
    (["--profile", "{p}", "--aggregated", "--prefill-workers", "1"], "leave out --prefill-workers"),
    (["--cluster", "{p}", "--policy", "prefix"], "cannot be combined with --policy"),
    (["--cluster", "{p}"], "non-empty \"pools\""),
    (["--profile", "{missing}"], "does not exist"),
])
def test_bad_clusters_are_named(tmp_path, profile, args, message):
    args = [a.format(p=profile, missing=tmp_path / "nope.json") for a in args]
    with pytest.raises(sim.SimError, match=message):
        sim.cluster_from_flags(parse(*args))


@pytest.mark.parametrize("step,term", [({"base_seconds": -1}, "base_seconds"),
                                       ({"decode_token_seconds": "x"}, "decode_token_seconds")])
def test_bad_profiles_are_refused(tmp_path, step, term):
    bad = json.loads(json.dumps(PROFILE))
    bad["step"].update(step)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(sim.SimError, match=f"step.{term} must be a finite number >= 0"):
        sim.cluster_from_flags(parse("--profile", path))


def test_profile_without_settings_asks_for_the_flag(tmp_path):
    partial = {k: v for k, v in PROFILE.items() if k != "kv_blocks"}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(partial))
    with pytest.raises(sim.SimError, match="no kv_blocks: give --kv-blocks"):
        sim.cluster_from_flags(parse("--profile", path))
    assert sim.cluster_from_flags(parse("--profile", path, "--kv_blocks", "8"))["pools"][0][
        "kv_blocks"] == 8


def test_cluster_file_profiles_are_relative_to_it(tmp_path, profile):
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "p.json").write_text(json.dumps(PROFILE))
    (folder / "cluster.json").write_text(json.dumps(
        {"policy": "least_loaded", "pools": [{"role": "both", "count": 2, "profile": "p.json"}]}))
    c = sim.cluster_from_flags(parse("--cluster", folder / "cluster.json"))
    assert c["pools"][0]["profile"] == str(folder / "p.json")


# ------------------------------------------------------------------------------------------------
# Whole runs on the fake simulator.
# ------------------------------------------------------------------------------------------------

WORKLOAD = ["--rates", "10,20", "--num-requests", "6", "--input-len", "8", "--output-len", "4",
            "--seed", "3", "--ttft-slo-ms", "1000", "--tpot-slo-ms", "1000",
            "--tenant", "name=a,weight=1", "--tenant", "name=b,weight=1,priority=1"]


def _keys(result):
    """Key sets at each level of a result JSON: top, run, rate point, summary, record."""
    run = result["runs"][0]
    point = run["rates"][0]
    return {"top": set(result), "run": set(run), "point": set(point),
            "summary": set(point["summary"]), "record": set(point["requests"][0])}


def test_simulated_and_real_runs_line_up(tmp_path, capsys, bin_dir, profile):
    """The same workload flags on a real bench run (against a fake OpenAI server) and on the
    simulator give the same requests, JSON keys and table rows."""
    with FakeServerThread() as server:
        assert cli.main(["--url", server.url, *WORKLOAD, "--no-progress",
                         "--result-json", str(tmp_path / "real.json")]) == 0
    real_out = capsys.readouterr().out
    out = run_sim(capsys, "--bin", bin_dir, "--profile", profile, "--decode-workers", "2",
                  *WORKLOAD, "--result-json", tmp_path / "sim.json",
                  "--plot-dir", tmp_path / "plots", "--work-dir", tmp_path / "work")
    real = json.loads((tmp_path / "real.json").read_text())
    simulated = json.loads((tmp_path / "sim.json").read_text())
    real_keys, sim_keys = _keys(real), _keys(simulated)
    for level in real_keys:
        missing = real_keys[level] - sim_keys[level]
        assert not missing, f"{level}: the simulated run lacks {missing}"
    assert simulated["tool"] == "tandem_sim" and simulated["simulated"] is True
    # The same requests, at the same times, with the same targets, tenants and priorities.
    for p_real, p_sim in zip(real["runs"][0]["rates"], simulated["runs"][0]["rates"]):
        for a, b in zip(p_real["requests"], p_sim["requests"]):
            for key in ("index", "scheduled_s", "requested_input_tokens",
                        "requested_output_tokens", "tenant", "priority", "ttft_slo_ms",
                        "tpot_slo_ms", "slo_class"):
                assert a[key] == b[key], key
        assert p_sim["summary"]["completed"] == 6 and p_sim["summary"]["slo_attainment"] == 1.0
    # The same table rows (the simulation adds the prefix-hit rate, which a run against --url
    # without --worker-metrics cannot read).
    real_rows = [name for name, _ in report._figures(real["runs"][0]["rates"][0])]
    sim_rows = [name for name, _ in report._figures(simulated["runs"][0]["rates"][0])]
    assert [r for r in sim_rows if r != "prefix hit rate, workers (%)"] == real_rows
    for row in ("TTFT p99 (ms)", "SLO attainment (%)", "DistServe goodput (90% attainment)"):
        assert row in out and row in real_out
    for name in ("latency_cdf.png", "latency_vs_rate.png", "attainment_vs_rate.png"):
        assert (tmp_path / "plots" / name).read_bytes().startswith(PNG)
    # --work-dir kept each rate's files, as the contract has them.
    work = tmp_path / "work"
    assert sorted(p.name for p in work.iterdir()) == ["c0-r0", "c0-r1"]
    trace = [json.loads(x) for x in (work / "c0-r1" / "trace.jsonl").read_text().splitlines()]
    assert len(trace) == 6 and trace[0]["arrival_s"] == 0.0
    c = json.loads((work / "c0-r1" / "cluster.json").read_text())
    assert [(p["role"], p["count"]) for p in c["pools"]] == [("prefill", 1), ("decode", 2)]


def test_records_carry_the_simulated_results(tmp_path, capsys, bin_dir, profile):
    run_sim(capsys, "--bin", bin_dir, "--profile", profile, "--decode-workers", "2",
            "--rate", "5", "--num-requests", "8", "--shared-prefix", "1,4,32", "--input-len", "8",
            "--output-len", "5", "--result-json", tmp_path / "r.json")
    [point] = json.loads((tmp_path / "r.json").read_text())["runs"][0]["rates"]
    records = point["requests"]
    # The fake caches a group's prefix from its second request on; the records say so.
    assert [r["cached_prompt_tokens"] for r in records] == [0] + [32] * 7
    assert point["prefix_hit"]["rate"] == pytest.approx(32 * 7 / (40 * 8))
    assert {r["decode_worker"] for r in records} == {"d0", "d1"}
    for r in records:
        assert r["ok"] and r["output_tokens"] == 5 and r["prompt_tokens"] == 40
        assert r["tpot_ms"] == pytest.approx((r["e2e_ms"] - r["ttft_ms"]) / 4)
        assert r["sent_s"] == r["scheduled_s"] and r["queue_ms"] == 0
        assert r["itl_ms"] == [] and r["migrated"] is False
    assert point["simulator"]["requests"] == 8
    last = max(r["scheduled_s"] + r["e2e_ms"] / 1000 for r in records)
    assert point["summary"]["duration_s"] == pytest.approx(last)


def test_shed_requests_are_failures_with_the_routers_message(tmp_path, capsys, bin_dir):
    (tmp_path / "p.json").write_text(json.dumps(PROFILE))
    (tmp_path / "c.json").write_text(json.dumps(
        {"policy": "slo", "admission": {"max_wait_s": 0.0},
         "pools": [{"role": "both", "count": 1, "profile": "p.json"}]}))
    out = run_sim(capsys, "--bin", bin_dir, "--cluster", tmp_path / "c.json", "--rate", "inf",
                  "--num-requests", "4", "--ttft-slo-ms", "10000",
                  "--result-json", tmp_path / "r.json")
    [point] = json.loads((tmp_path / "r.json").read_text())["runs"][0]["rates"]
    assert [r["ok"] for r in point["requests"]] == [True, False, False, False]
    assert point["requests"][1]["status"] == "RESOURCE_EXHAUSTED"
    assert point["summary"]["errors"] == {"RESOURCE_EXHAUSTED: fake admission shed it": 3}
    assert point["summary"]["slo_attainment"] == 0.25
    assert "3 x RESOURCE_EXHAUSTED: fake admission shed it" in out


def test_ab_compares_two_policies_on_the_same_requests(tmp_path, capsys, bin_dir, profile):
    out = run_sim(capsys, "--bin", bin_dir, "--profile", profile, "--decode-workers", "2",
                  "--ab", "policy=round_robin", "policy=prefix decode_workers=3",
                  "--rates", "2,4", "--num-requests", "5", "--result-json", tmp_path / "r.json")
    runs = json.loads((tmp_path / "r.json").read_text())["runs"]
    assert [r["label"] for r in runs] == ["policy=round_robin", "policy=prefix decode_workers=3"]
    assert [r["cluster"]["policy"] for r in runs] == ["round_robin", "prefix"]
    assert [r["cluster"]["pools"][-1]["count"] for r in runs] == [2, 3]
    for pa, pb in zip(runs[0]["rates"], runs[1]["rates"]):
        assert [r["scheduled_s"] for r in pa["requests"]] == \
            [r["scheduled_s"] for r in pb["requests"]]
    assert "A: policy=round_robin" in out and "B/A" in out


def test_ab_sides_only_add_to_the_base_flags(tmp_path, capsys, bin_dir, profile):
    run_sim(capsys, "--bin", bin_dir, "--profile", profile, "--fail", "5:d0",
            "--ab", "fail=9:d1 aggregated", "policy=least_loaded", "--rate", "2",
            "--num-requests", "3", "--result-json", tmp_path / "r.json")
    a, b = (r["cluster"] for r in json.loads((tmp_path / "r.json").read_text())["runs"])
    assert a["failures"] == [{"at_s": 5.0, "worker": "d0"}, {"at_s": 9.0, "worker": "d1"}]
    assert [p["role"] for p in a["pools"]] == ["both"] and a["policy"] == "slo"
    assert b["failures"] == [{"at_s": 5.0, "worker": "d0"}]
    assert [p["role"] for p in b["pools"]] == ["prefill", "decode"]
    assert b["policy"] == "least_loaded"


def test_dataset_prompts_become_trace_lengths(tmp_path, capsys, bin_dir, profile):
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(x) for x in [
        {"prompt": "x" * 400, "output_tokens": 7},
        {"conversations": [{"from": "human", "value": "y" * 80},
                           {"from": "gpt", "value": "z" * 40}]}]) + "\n")
    run_sim(capsys, "--bin", bin_dir, "--profile", profile, "--dataset", data, "--rate", "1",
            "--num-requests", "4", "--work-dir", tmp_path / "work")
    trace = [json.loads(x) for x in (tmp_path / "work" / "c0-r0" / "trace.jsonl").read_text()
             .splitlines()]
    # 4 characters a token, as tandem bench estimates them; the reply's length is the output's.
    assert sorted({(x["prompt_tokens"], x["output_tokens"]) for x in trace}) == [(20, 10),
                                                                               (100, 7)]


def test_parallel_and_serial_runs_agree(tmp_path, capsys, bin_dir, profile):
    def records(jobs):
        path = tmp_path / f"j{jobs}.json"
        run_sim(capsys, "--bin", bin_dir, "--profile", profile, "--rates", "1,2,4,8",
                "--num-requests", "6", "--jobs", str(jobs), "--result-json", path)
        runs = json.loads(path.read_text())["runs"]
        return [[(r["ttft_ms"], r["e2e_ms"]) for r in p["requests"]] for p in runs[0]["rates"]]

    assert records(1) == records(4)


def test_slo_scale_multiplies_the_simulated_unloaded_latency(tmp_path, capsys, bin_dir, profile):
    run_sim(capsys, "--bin", bin_dir, "--profile", profile, "--rates", "1,2",
            "--num-requests", "4", "--input-len", "10", "--output-len", "3",
            "--slo-scale", "4", "--unloaded-requests", "2", "--result-json", tmp_path / "r.json")
    result = json.loads((tmp_path / "r.json").read_text())
    unloaded = result["runs"][0]["unloaded"]
    assert unloaded["requests"] == 2 and unloaded["failed"] == 0
    targets = result["slo_scale_targets"]
    assert targets["ttft_ms"] == pytest.approx(4 * unloaded["ttft_ms"])
    assert targets["tpot_ms"] == pytest.approx(4 * unloaded["tpot_ms"])
    for point in result["runs"][0]["rates"]:
        assert all(r["ttft_slo_ms"] == pytest.approx(targets["ttft_ms"]) for r in point["requests"])


def test_missing_simulator_is_a_clear_error(tmp_path, capsys, profile):
    with pytest.raises(SystemExit):
        sim.main(["--bin", str(tmp_path), "--profile", str(profile), "--num-requests", "2"])
    err = capsys.readouterr().err
    assert f"the simulator {tmp_path}/tandem_sim is missing" in err and "--bin" in err


def test_simulator_errors_are_passed_on(tmp_path, capsys, bin_dir):
    (tmp_path / "c.json").write_text(json.dumps(
        {"pools": [{"role": "prefill", "count": 1, "profile": PROFILE}]}))
    with pytest.raises(SystemExit) as info:
        sim.main(["--bin", str(bin_dir), "--cluster", str(tmp_path / "c.json"),
                  "--num-requests", "2"])
    assert "tandem_sim failed (exit 2)" in str(info.value)
    assert "no decode pool" in str(info.value)


@pytest.mark.parametrize("args,message", [
    (["--ab", "policy=nope", "policy=slo"], "not cluster flags"),
    (["--ab", "frobnicate=1", "policy=slo"], "not cluster flags"),
    (["--label", "x", "--ab", "policy=slo", "policy=prefix"], "--label names one"),
    (["--duration", "5"], "--duration needs finite rates"),
    (["--link-latency-us", "-1"], "must be a finite number >= 0"),
    (["--step-noise", "nan"], "must be a finite number >= 0"),
    (["--fail", "d3"], "is not AT_S:WORKER"),
    (["--kv-blocks", "-2"], "must be >= 0"),
])
def test_bad_flags_are_argparse_errors(capsys, bin_dir, profile, args, message):
    with pytest.raises(SystemExit) as info:
        sim.main(["--bin", str(bin_dir), "--profile", str(profile), *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_live_only_flags_are_not_offered():
    text = sim.build_parser().format_help()
    for flag in ("--max-concurrency", "--warmup", "--temperature", "--no-send-slo", "--url"):
        assert flag not in text
    for flag in ("--shared-prefix", "--slo-class", "--tenant", "--dataset", "--burstiness",
                 "--prefill-workers", "--kv-blocks", "--jobs", "--ab", "--cluster"):
        assert flag in text


def test_module_entry_point_runs(tmp_path, bin_dir, profile):
    """`python -m tandem_bench.sim`, as `tandem sim` runs it."""
    import subprocess
    env = dict(os.environ, PYTHONPATH=str(HERE.parents[1] / "bench"), TANDEM_BIN_DIR=str(bin_dir))
    result = subprocess.run([sys.executable, "-m", "tandem_bench.sim", "--profile", str(profile),
                             "--rate", "3", "--num-requests", "3"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "sim: rate (req/s)" in result.stdout


def test_the_real_simulator_drops_in(tmp_path, capsys):
    """sim/'s tandem_sim from TANDEM_BIN_DIR (the build), when it is there, on a roofline profile
    of the default model: every request answered, the shared prefixes cached, and the simulator's
    own attainment equal to the one metrics.summarize computes from its results."""
    bin_dir = os.environ.get("TANDEM_BIN_DIR")
    if not bin_dir or not os.access(os.path.join(bin_dir, "tandem_sim"), os.X_OK):
        pytest.skip("tandem_sim is not built in TANDEM_BIN_DIR (sim/ is not on this branch yet)")
    from tandem_bench import profile as roofline
    assert roofline.main(["--roofline", "--gpu", "h100", "--model",
                          str(HERE.parents[1] / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"),
                          "--kv_blocks", "2048", "--max_running", "32", "--token_budget", "256",
                          "--out", str(tmp_path / "p.json")]) == 0
    run_sim(capsys, "--bin", bin_dir, "--profile", tmp_path / "p.json", "--decode-workers", "2",
            "--rates", "100,400", "--num-requests", "64", "--shared-prefix", "2,8,128",
            "--input-len", "32", "--output-len", "8", "--ttft-slo-ms", "2", "--tpot-slo-ms", "1",
            "--result-json", tmp_path / "r.json")
    for point in json.loads((tmp_path / "r.json").read_text())["runs"][0]["rates"]:
        records = point["requests"]
        assert all(r["ok"] and r["output_tokens"] == 8 for r in records)
        assert {r["decode_worker"] for r in records} <= {"d0", "d1"}
        # 2 groups x 8 prompts repeated: after the first few, the 128-token prefix is cached.
        assert sum(r["cached_prompt_tokens"] >= 128 for r in records) >= 48
        assert point["simulator"]["requests"] == 64
        assert point["simulator"]["slo_attainment"] == pytest.approx(
            point["summary"]["slo_attainment"], abs=1e-9)
