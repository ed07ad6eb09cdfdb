"""`tandem plan` (bench/tandem_bench/plan.py) on the real tandem_sim --plan (sim/planner.h).

The workload's answer is known by construction: a decode step of k sequences lasts
10 ms + 10 ms * k (the profile's only terms), so a 25 ms TPOT holds only while a worker decodes
one sequence at a time; each request decodes 100 tokens (about 2 s alone) and one arrives every
1.25 s (--arrival constant --rate 0.8). One worker must hold two at once (TPOT >= 30 ms), two
taking turns hold one each: the cheapest cluster is 2 workers doing both (cost 2), the runner-up
1 prefill + 2 decode (cost 3)."""
import json
import os
import pathlib

import pytest

from tandem_bench import plan

PNG = b"\x89PNG\r\n\x1a\n"
PROFILE = {"format": "tandem-profile-v1", "model": "test", "engine": "test", "source": "measured",
           "step": {"base_seconds": 0.01, "prefill_token_seconds": 0.0,
                    "decode_token_seconds": 0.01, "context_token_seconds": 0.0,
                    "prompt_context_token_seconds": 0.0},
           "kv_bytes_per_token": 1024, "block_size": 16, "kv_blocks": 4096, "max_running": 32,
           "token_budget": 256}
WORKLOAD = ["--rate", "0.8", "--arrival", "constant", "--num-requests", "20", "--input-len", "16",
            "--output-len", "100", "--tpot-slo-ms", "25", "--policies", "round_robin"]


@pytest.fixture
def bin_dir():
    folder = os.environ.get("TANDEM_BIN_DIR")
    if not folder or not os.access(os.path.join(folder, "tandem_sim"), os.X_OK):
        pytest.skip("tandem_sim is not built in TANDEM_BIN_DIR")
    return folder


def run(*args):
    return plan.main([str(a) for a in args])


def test_cheapest_is_known_by_construction(tmp_path, capsys, bin_dir, profile):
    code = run("--bin", bin_dir, "--profile", profile, *WORKLOAD, "--max-workers", "8",
               "--result-json", tmp_path / "plan.json", "--plot", tmp_path / "plots",
               "--jobs", "2")
    out = capsys.readouterr().out
    assert code == 0
    best = next(line for line in out.splitlines() if line.startswith("best:"))
    runner = next(line for line in out.splitlines() if line.startswith("runner-up:"))
    assert "2x both round_robin" in best and "cost 2" in best and "margin +10.0 pts" in best
    assert "1P+2D round_robin" in runner and "cost 3" in runner
    result = json.loads((tmp_path / "plan.json").read_text())["plan"]
    assert result["best"]["both_workers"] == 2 and result["best"]["attainment"] == 1.0
    # Twice the rate gives each of the two workers what one gets at the base rate: it misses.
    assert 1.0 <= result["best"]["headroom_scale"] < 2.0
    assert result["offered_rate"] == pytest.approx(0.8)
    assert (tmp_path / "plots" / "attainment_vs_rate.png").read_bytes().startswith(PNG)
    # The curves cover the plot's rate multiples, and the best one meets the target at the
    # workload's rate but not at twice it.
    curve = result["curves"][0]
    assert curve["label"] == "2x both round_robin"
    by_rate = {round(r, 6): a for r, a in zip(curve["rates"], curve["attainments"])}
    assert len(by_rate) == 7 and by_rate[0.8] >= 0.9 > by_rate[1.6]


def test_per_role_costs_change_the_choice(capsys, bin_dir, profile):
    assert run("--bin", bin_dir, "--profile", profile, *WORKLOAD, "--max-workers", "8",
               "--cost-both", "5") == 0
    best = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("best:"))
    assert "1P+2D round_robin" in best and "cost 3" in best


def test_nothing_meets_within_max_workers(capsys, bin_dir, profile):
    assert run("--bin", bin_dir, "--profile", profile, *WORKLOAD, "--max-workers", "1",
               "--shapes", "aggregated") == 1
    out = capsys.readouterr().out
    assert "best:      none" in out and "nothing within --max-workers 1" in out


def test_simulator_refusals_are_passed_on(tmp_path, bin_dir, profile):
    cluster = {"pools": [{"role": "decode", "count": 1, "profile": str(profile)}],
               "failures": [{"at_s": 1, "worker": "d0"}]}
    (tmp_path / "c.json").write_text(json.dumps(cluster))
    with pytest.raises(SystemExit, match="failures"):
        run("--bin", bin_dir, "--cluster", tmp_path / "c.json", *WORKLOAD)


@pytest.mark.parametrize("args, message", [
    (["--rate", "1", "--decode-workers", "2"], "--decode-workers is what tandem plan searches"),
    (["--rate", "1", "--policy", "slo"], "--policy"),
    (["--rates", "1,2"], "--rates: a plan is for one workload"),
    (["--rate", "1", "--policies", "fastest"], "'fastest' is not a policy"),
    (["--rate", "1", "--token-budgets", "0"], "'0' is not an integer >= 1"),
    (["--rate", "1", "--shapes", "both"], "'both' is not aggregated or disaggregated"),
    (["--rate", "1", "--label", "x"], "--label names a run"),
    (["--rate", "1", "--slo-scale", "3"], "--slo-scale is not supported"),
])
def test_bad_flags_are_named(capsys, profile, args, message):
    with pytest.raises(SystemExit) as exit_info:
        run("--profile", profile, "--tpot-slo-ms", "25", *args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_plan_needs_an_objective_and_a_rate(capsys, profile):
    for args, message in ((["--rate", "1"], "no objective"),
                          (["--tpot-slo-ms", "25"], "--rate: give the workload's finite")):
        with pytest.raises(SystemExit):
            run("--profile", profile, *args)
        assert message in capsys.readouterr().err


def test_planning_peers_script_runs(tmp_path, capsys, bin_dir, profile):
    """bench/planning_peers.py (docs/sim.md, "The peers' results") end to end on a small sweep:
    every configuration of both experiments gets an attainment per rate and a goodput entry."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "planning_peers", pathlib.Path(__file__).resolve().parents[2] / "bench" /
        "planning_peers.py")
    peers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peers)
    assert peers.main(["--bin", bin_dir, "--profile", f"test={profile}:100", "--workers", "2",
                       "--scales", "0.5,1", "--seeds", "1", "--prompt", "32", "--output", "8",
                       "--jobs", "2", "--out", str(tmp_path / "peers.json")]) == 0
    result = json.loads((tmp_path / "peers.json").read_text())
    [distserve] = result["distserve"]
    assert [r["config"] for r in distserve["rows"]] == ["2x both", "1P+1D"]
    [alpaserve] = result["alpaserve"]
    assert [r["config"] for r in alpaserve["rows"]] == ["shared 2x both",
                                                         "dedicated 2 x 1x both"]
    for row in distserve["rows"] + alpaserve["rows"]:
        assert len(row["attainments"]) == 2 and all(0 <= a <= 1 for a in row["attainments"])
        assert len(row["goodput_by_seed"]) == 1
    assert "DistServe shape, test" in capsys.readouterr().out
