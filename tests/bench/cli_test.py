"""The command line: `python -m tandem_bench` as `tandem bench` runs it (help, clear errors on bad
flags and files), and a whole sweep against a fake OpenAI server: the tables, the result JSON and
the plots."""
import asyncio
import json
import os
import subprocess
import sys
import threading

import pytest

from clients_test import FakeOpenAI
from conftest import ROOT
from tandem_bench import cli

PNG = b"\x89PNG\r\n\x1a\n"


def bench(*args, env=None):
    full_env = dict(os.environ, PYTHONPATH=str(ROOT / "bench"))
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "tandem_bench", *args], capture_output=True,
                          text=True, env=full_env, timeout=120)


def test_help():
    result = bench("--help")
    assert result.returncode == 0
    for flag in ("--protocol", "--rates", "--burstiness", "--shared-prefix", "--slo-class",
                 "--slo-scale", "--ab", "--result-json", "--plot-dir", "docs/bench.md"):
        assert flag in result.stdout


@pytest.mark.parametrize("args,message", [
    (["--dataset", "/no/such/file.jsonl"], "dataset file '/no/such/file.jsonl' does not exist"),
    (["--arrival", "poisson", "--burstiness", "0.5"], "--burstiness 0.5 needs --arrival gamma"),
    (["--rates", "1,x"], "'x' is not a rate"),
    (["--rates", "1,1"], "repeats a rate"),
    (["--rate", "-2"], "must be positive"),
    (["--rate", "1", "--rates", "1,2"], "not allowed with argument"),
    (["--duration", "10"], "--duration needs finite rates"),
    (["--slo-scale", "2", "--ttft-slo-ms", "100"], "either --slo-scale or"),
    (["--slo-class", "name=a,weight=1,colour=red"], "unknown field(s) colour"),
    (["--tenant", "name=a"], "positive weight"),
    (["--shared-prefix", "4,8"], "expected N,M,LEN"),
    (["--shared-prefix", "1,1,1", "--dataset", "x.jsonl"], "cannot be combined"),
    (["--url", "http://h:1", "--up"], "--url names a running server"),
    (["--ab", "policy=round_robin", "bad!flag"], "'bad!flag' is not a `tandem up` flag"),
    (["--ab", "policy=", "x"], "the flag has no value"),
    (["--range-ratio", "1.5"], "range ratio"),
    (["--attainment-target", "1.5"], "must be in (0, 1]"),
    (["--protocol", "http"], "invalid choice"),
    (["--bin", "/tmp"], "--bin is only used with --up or --ab"),
    (["--ab", "aggregated", "", "--label", "x"], "--label names one configuration"),
])
def test_bad_flags_are_argparse_errors(args, message):
    result = bench(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "usage: tandem bench" in result.stderr
    assert message in result.stderr


def test_a_key_that_cannot_be_a_header_is_refused_without_printing_it():
    for args, env in [(["--api-key", "tdm-secret key"], {}),
                      ([], {"TANDEM_API_KEY": "tdm-secret\tkey"})]:
        result = bench(*args, env=env)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "printable ASCII without spaces" in result.stderr
        assert "secret" not in result.stderr


def test_the_api_key_comes_from_the_flag_then_tandem_then_openai():
    env = {"TANDEM_API_KEY": "t", "OPENAI_API_KEY": "o"}
    assert cli.api_key("f", env) == "f"
    assert cli.api_key(None, env) == "t"
    assert cli.api_key(None, {"OPENAI_API_KEY": "o"}) == "o"
    assert cli.api_key(None, {"TANDEM_API_KEY": "", "OPENAI_API_KEY": ""}) is None


@pytest.mark.parametrize("argv,redacted", [
    (["--api-key", "k", "--rate", "1"], ["--api-key", "<redacted>", "--rate", "1"]),
    (["--api-key=k"], ["--api-key=<redacted>"]),
    (["--api", "k"], ["--api", "<redacted>"]),   # argparse's unambiguous prefix
    (["--ab", "a", "b"], ["--ab", "a", "b"]),
])
def test_the_recorded_command_hides_the_api_key(argv, redacted):
    assert cli.redact_api_key(argv) == redacted


def test_missing_binaries_are_a_clear_error(tmp_path):
    result = bench("--up", "aggregated", "--bin", str(tmp_path), "--num-requests", "1")
    assert result.returncode == 1
    assert f"{tmp_path}/tandem is missing" in result.stderr


def test_a_server_that_does_not_answer_stops_the_run():
    # A port that nothing listens on: every warm-up request fails, and the run says why.
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = bench("--url", f"http://127.0.0.1:{port}", "--num-requests", "2", "--no-progress")
    assert result.returncode == 1
    assert f"every warm-up request to http://127.0.0.1:{port} failed" in result.stderr
    assert "ConnectError" in result.stderr


class FakeServerThread:
    """A FakeOpenAI on its own event loop in a thread (the CLI runs its own loop)."""

    def __enter__(self):
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.server = self.loop.run_until_complete(FakeOpenAI().start())
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)
        return self.server

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_sweep_against_a_fake_server_writes_json_and_plots(tmp_path, capsys):
    with FakeServerThread() as server:
        code = cli.main(["--url", server.url, "--rates", "10,20", "--num-requests", "6",
                         "--input-len", "8", "--output-len", "4", "--seed", "3",
                         "--ttft-slo-ms", "1000", "--tpot-slo-ms", "1000",
                         "--tenant", "name=a,weight=1", "--tenant", "name=b,weight=1,priority=1",
                         "--result-json", str(tmp_path / "out" / "r.json"),
                         "--plot-dir", str(tmp_path / "plots"), "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert "TTFT p99 (ms)" in out and "SLO attainment (%)" in out
    assert "DistServe goodput (90% attainment): >= 20 req/s" in out
    result = json.loads((tmp_path / "out" / "r.json").read_text())
    assert result["seed"] == 3 and result["rates"] == [10.0, 20.0]
    assert result["command"][:2] == ["--url", server.url]
    assert result["config"]["tenant"] == ["name=a,weight=1", "name=b,weight=1,priority=1"]
    [run] = result["runs"]
    assert run["warmup"] == {"requests": 1, "failed": 0}
    assert [p["rate"] for p in run["rates"]] == [10.0, 20.0]
    for point in run["rates"]:
        assert len(point["requests"]) == 6 and point["summary"]["completed"] == 6
        assert point["summary"]["slo_attainment"] == 1.0
        for r in point["requests"]:
            assert r["ok"] and r["output_tokens"] == 4 and r["requested_output_tokens"] == 4
            assert 100 < r["ttft_ms"] < r["e2e_ms"] and r["met_slo"] is True
            assert r["tenant"] in ("a", "b") and r["priority"] == (1 if r["tenant"] == "b" else 0)
    assert run["distserve_goodput"] == {"goodput": 20.0, "bound": "at_least", "target": 0.9}
    # 1 warm-up + 2 x 6 requests reached the server, with ignore_eos and max_tokens 4.
    assert len(server.bodies) == 13
    assert all(b["ignore_eos"] and b["max_tokens"] == 4 for b in server.bodies)
    assert all(b["slo"] == {"ttft_ms": 1000, "tpot_ms": 1000} for b in server.bodies)
    for name in ("latency_cdf.png", "latency_vs_rate.png", "attainment_vs_rate.png"):
        data = (tmp_path / "plots" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000


def test_same_seed_sends_the_same_prompts_at_the_same_times(tmp_path):
    def run(seed, name):
        with FakeServerThread() as server:
            path = tmp_path / name
            cli.main(["--url", server.url, "--rate", "50", "--num-requests", "5", "--warmup", "0",
                      "--input-len", "6", "--output-len", "2", "--seed", str(seed),
                      "--result-json", str(path), "--no-progress"])
            requests = json.loads(path.read_text())["runs"][0]["rates"][0]["requests"]
            return [b["prompt"] for b in server.bodies], [r["scheduled_s"] for r in requests]

    first, again, other = run(1, "a.json"), run(1, "b.json"), run(2, "c.json")
    # The server may see them out of order; the set of prompts and the schedule are the same.
    assert sorted(first[0]) == sorted(again[0]) and first[1] == again[1]
    assert sorted(other[0]) != sorted(first[0]) and other[1] != first[1]
