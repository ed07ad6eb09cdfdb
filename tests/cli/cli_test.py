"""The `tandem` command as a user runs it: a real process, its output and exit codes."""
import json
import re
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

BIN = Path(os.environ["TANDEM_BIN_DIR"]) / "tandem"
MODEL = Path(os.environ["TANDEM_SOURCE_DIR"]) / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def run(*args, env=None, timeout=60):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    full_env.update(env or {})
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, env=full_env,
                          timeout=timeout)


def test_version_names_the_build_and_the_accelerators():
    p = run("version")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("tandem 0.1.0 ")
    assert "cuda: " in p.stdout
    # A machine without a GPU says why instead of failing.
    assert "gpu 0: " in p.stdout or "gpus: none (" in p.stdout


def test_help_and_no_command_print_usage():
    for args in (("help",), ()):
        p = run(*args)
        assert p.returncode == 0
        assert "usage: tandem <command>" in p.stdout
        assert "up " in p.stdout


def test_unknown_command_is_a_usage_error():
    p = run("fly")
    assert p.returncode == 2
    assert "unknown command 'fly'" in p.stderr


def test_unknown_flag_is_a_usage_error():
    p = run("version", "--no_such_flag=1")
    assert p.returncode != 0
    assert "no_such_flag" in p.stderr


def test_flags_come_from_the_environment():
    p = run("version", env={"TANDEM_LOG_LEVEL": "loud"})
    assert p.returncode == 2
    assert "unknown log level 'loud'" in p.stderr
    # The command line wins over the environment.
    p = run("version", "--log_level=info", env={"TANDEM_LOG_LEVEL": "loud"})
    assert p.returncode == 0, p.stderr


def test_environment_typo_is_warned_about():
    p = run("version", env={"TANDEM_LOG_LEVLE": "debug"})
    assert p.returncode == 0
    assert "TANDEM_LOG_LEVLE matches no flag" in p.stderr


def test_up_with_a_missing_model_names_it(tmp_path):
    p = run("up", f"--model={tmp_path}/absent.gguf")
    assert p.returncode == 1
    assert "absent.gguf does not exist" in p.stderr
    p = run("up", env={"TANDEM_MODELS_DIR": str(tmp_path)})
    assert p.returncode == 1
    assert "default model is missing" in p.stderr and "scripts/setup.sh" in p.stderr


def test_up_starts_a_cluster_that_answers_and_stops_cleanly():
    """`tandem up` on the default model: a router with a prefill and a decode worker, healthy,
    answering an OpenAI request with curl, and gone (children included) after SIGTERM."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    p = subprocess.Popen([str(BIN), "up", "--http_port=0", "--grpc_port=0"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    try:
        port = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "OpenAI HTTP API: http://127.0.0.1:" in line:
                port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
            if "gRPC API:" in line:
                grpc_address = line.split("gRPC API:")[1].split()[0]
            if "Ctrl-C stops the cluster" in line:
                break
        assert port, "".join(lines)
        out = "".join(lines)
        assert "SmolLM2-135M-Instruct.Q4_1.gguf" in out and "curl http://127.0.0.1:" in out
        # Every worker's /metrics is listed and answers.
        worker_metrics = re.findall(r"(decode|prefill)-0 127\.0\.0\.1:\d+ \(metrics "
                                    r"(http://127\.0\.0\.1:\d+/metrics)\)", out)
        assert sorted(kind for kind, _ in worker_metrics) == ["decode", "prefill"], out
        for _, url in worker_metrics:
            assert "tandem_worker_" in urllib.request.urlopen(url, timeout=10).read().decode()
        body = json.dumps({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})
        curl = subprocess.run(["curl", "-sS", f"http://127.0.0.1:{port}/v1/completions",
                               "-H", "Content-Type: application/json", "-d", body],
                              capture_output=True, text=True, timeout=60)
        answer = json.loads(curl.stdout)
        assert "Paris" in answer["choices"][0]["text"], curl.stdout
        assert answer["usage"]["completion_tokens"] == 8
        # `tandem generate --url` is the cluster's own client: the same greedy text as in one
        # process, and the cluster's account of the request on stderr.
        args = ("generate", "--prompt=The capital of France is", "--max_tokens=8")
        remote = run(*args, f"--url={grpc_address}")
        assert remote.returncode == 0, remote.stderr
        local = run(*args, "--threads=1")
        assert remote.stdout == local.stdout and "Paris" in remote.stdout, (remote, local)
        prompt_tokens = local.stderr.split("prompt: ")[1].split(" tokens")[0]
        assert f"prompt: {prompt_tokens} tokens" in remote.stderr, (remote.stderr, local.stderr)
        assert "generated: 8 tokens" in remote.stderr, remote.stderr
        assert "decode worker decode-0, prefill local" in remote.stderr, remote.stderr
        children = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                                   text=True).stdout.split()
        assert len(children) == 3, children  # router, prefill and decode worker
        # Prompt pieces: 128 tokens a step on the prefill worker, 32 on the decode worker, whose
        # steps carry its streams' tokens.
        argv = {}
        for pid in children:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode().split("\0")
            argv[os.path.basename(args[0])] = args
        assert "--max_prefill_tokens=128" in argv["tandem-prefill"], argv
        assert "--max_prefill_tokens=32" in argv["tandem-decode"], argv
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        assert p.returncode == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    # The workers and the router it started are gone too (other tests' clusters may be running):
    # `tandem up` waited for them, so each is gone or a zombie about to be reaped by init.
    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(") ")[1][0] != "Z"
        except OSError:
            return False
    left = [pid for pid in children if alive(pid)]
    assert not left, "processes left behind: " + " ".join(left)


def test_generate_streams_text_and_reports_speed():
    p = run("generate", "--prompt=The capital of France is", "--max_tokens=8", "--threads=2")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip(), "no text generated"
    assert "prompt: 5 tokens in" in p.stderr and "tokens/s" in p.stderr
    assert "generated: 8 tokens" in p.stderr


def test_generate_chat_answers_with_the_template():
    p = run("generate", "--chat", "--prompt=What is the capital of France? Answer in one sentence.",
            "--max_tokens=40", "--threads=2")
    assert p.returncode == 0, p.stderr
    assert "Paris" in p.stdout
    assert "[stop]" in p.stderr  # ended at <|im_end|>, not by length
    assert "<|im_end|>" not in p.stdout


def test_generate_same_seed_same_text():
    args = ("generate", "--prompt=Tell me a story.", "--max_tokens=16", "--temperature=0.9",
            "--seed=7", "--threads=2")
    a, b = run(*args), run(*args)
    assert a.returncode == 0 and b.returncode == 0
    assert a.stdout == b.stdout


def test_generate_json_gives_token_ids_and_log_probabilities():
    """--json with --logprobs/--prompt_logprobs (how lm-evaluation-harness's scores are computed
    from the engine alone, tests/eval): the prompt's log-probabilities against llama.cpp's on the
    same ids, and --prompt_ids taking those ids back as given."""
    import llama_cpp  # in .venv, from scripts/setup.sh
    import numpy as np

    prompt = "The capital of France is"
    common = ("--max_tokens=4", "--threads=2", "--json", "--logprobs=2", "--prompt_logprobs=3")
    p = run("generate", f"--prompt={prompt}", *common)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    plain = run("generate", f"--prompt={prompt}", "--max_tokens=4", "--threads=2")
    assert out["text"] + "\n" == plain.stdout
    assert out["finish_reason"] == "length" and len(out["tokens"]) == 4
    for t in out["tokens"]:  # greedy: the chosen token is the most likely one
        assert len(t["top"]) == 2 and t["top"][0] == {"id": t["id"], "logprob": t["logprob"]}
    ids = out["prompt_ids"]
    again = run("generate", "--prompt_ids=" + ",".join(map(str, ids)), *common)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == out

    llm = llama_cpp.Llama(model_path=str(MODEL), n_ctx=64, logits_all=True, n_threads=2,
                          verbose=False)
    assert ids == llm.tokenize(prompt.encode(), add_bos=False)
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
    logits -= logits.max(-1, keepdims=True)
    ref = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    scored = out["prompt_logprobs"]
    assert [s["id"] for s in scored] == ids[1:]
    diffs = []
    for pos, s in enumerate(scored, start=1):
        assert len(s["top"]) == 3
        assert [t["logprob"] for t in s["top"]] == sorted((t["logprob"] for t in s["top"]),
                                                         reverse=True)
        assert s["logprob"] <= s["top"][0]["logprob"] + 1e-6
        diffs.append(abs(s["logprob"] - ref[pos - 1, ids[pos]]))
    # Quantization noise between the two engines on this Q4_1 model (as openai_echo_test).
    assert np.mean(diffs) <= 0.35, diffs


def test_bench_runs_the_load_generator_with_its_own_flags():
    """`tandem bench` hands its arguments to bench/tandem_bench in the project's environment."""
    p = run("bench", "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: tandem bench") and "--rates" in p.stdout, p.stdout[:300]
    p = run("bench", "--rate=-1", "--url=http://127.0.0.1:1")
    assert p.returncode == 2 and "rate" in p.stderr, p.stderr


def test_sim_runs_the_simulated_bench_with_its_own_flags(tmp_path):
    """`tandem sim` hands its arguments to bench/tandem_bench/sim.py; without a simulator in the
    folder it looks in, it says which file is missing."""
    p = run("sim", "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: tandem sim") and "--decode-workers" in p.stdout, p.stdout[:300]
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"format": "tandem-profile-v1", "step": {
        "base_seconds": 0.01, "prefill_token_seconds": 0, "decode_token_seconds": 0,
        "context_token_seconds": 0, "prompt_context_token_seconds": 0},
        "kv_blocks": 64, "block_size": 16, "max_running": 8, "token_budget": 64}))
    p = run("sim", f"--bin={tmp_path}", f"--profile={profile}", "--num-requests=2")
    assert p.returncode == 2 and f"{tmp_path}/tandem_sim is missing" in p.stderr, p.stderr


def test_plan_hands_its_arguments_to_the_planner_front_end():
    """`tandem plan` runs bench/tandem_bench/plan.py with this build's tandem_sim."""
    p = run("plan", "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: tandem plan") and "--token-budgets" in p.stdout, \
        p.stdout[:300]
    p = run("plan", "--rate=1", "--tpot-slo-ms=50", "--decode-workers=2")
    assert p.returncode == 2 and "--decode-workers is what tandem plan searches" in p.stderr, \
        p.stderr


def test_generate_with_a_bad_url_is_a_clear_error():
    p = run("generate", "--prompt=hi", "--url=http://127.0.0.1:8000/v1")
    assert p.returncode == 2 and "is an HTTP URL" in p.stderr, p.stderr
    p = run("generate", "--prompt=hi", "--url=nowhere")
    assert p.returncode == 2 and "host:port" in p.stderr, p.stderr
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    p = run("generate", "--prompt=hi", f"--url=127.0.0.1:{free}")
    assert p.returncode == 1 and "no cluster answers at 127.0.0.1:" in p.stderr, p.stderr


def test_generate_bad_input_is_a_clear_error():
    cases = [
        (("--prompt=",), "empty"),
        (("--prompt=hi", "--temperature=-1"), "temperature"),
        (("--prompt=hi", "--top_p=0"), "top_p"),
        (("--prompt=hi", "--max_tokens=0"), "max_tokens"),
        (("--prompt=hi", "--max_tokens=100000"), "context"),
        (("--prompt_ids=1,x",), "prompt_ids"),
        (("--prompt_ids=1,2", "--prompt=hi"), "prompt_ids"),
        (("--prompt_ids=1,99999999",), "vocabulary"),
        (("--prompt=hi", "--logprobs=2"), "--json"),
        (("--prompt=hi", "--json", "--logprobs=21"), "logprobs"),
        (("--prompt=hi", "--json", "--prompt_logprobs=-1"), "prompt_logprobs"),
        (("--prompt=hi", "--json", "--url=127.0.0.1:1"), "--url"),
    ]
    for args, word in cases:
        p = run("generate", *args)
        assert p.returncode == 2, (args, p.stderr)
        assert "INVALID_ARGUMENT" in p.stderr and word in p.stderr, (args, p.stderr)


def test_generate_on_a_malformed_model_names_the_file(tmp_path):
    source = Path(os.environ["TANDEM_SOURCE_DIR"]) / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(source.read_bytes()[:4096])
    p = run("generate", f"--model={broken}", "--prompt=hi")
    assert p.returncode == 1
    assert "broken.gguf" in p.stderr
    not_gguf = tmp_path / "text.gguf"
    not_gguf.write_text("this is not a model\n" * 10)
    p = run("generate", f"--model={not_gguf}", "--prompt=hi")
    assert p.returncode != 0 and "text.gguf" in p.stderr


def test_apikey_prints_a_fresh_key_and_its_line():
    """The line holds the key's SHA-256 (checked with hashlib) and the limits, never the key."""
    import hashlib
    keys = set()
    for _ in range(2):
        p = run("apikey", "--tenant=team-a", "--rps=2.5", "--concurrency=3")
        assert p.returncode == 0, p.stderr
        key = re.search(r"^  (tdm-[A-Za-z0-9_-]{43})$", p.stdout, re.M).group(1)
        line = re.search(r"^  (team-a sha256:.*)$", p.stdout, re.M).group(1)
        assert line == f"team-a sha256:{hashlib.sha256(key.encode()).hexdigest()} rps=2.5 " \
                       "concurrency=3", p.stdout
        keys.add(key)
    assert len(keys) == 2
    for bad in (["--tenant=bad name"], [], ["--tenant=a", "--rps=-1"],
                ["--tenant=a", "--concurrency=-2"]):
        p = run("apikey", *bad)
        assert p.returncode == 2 and p.stderr.startswith("error: --"), (bad, p.stderr)


def test_up_takes_api_keys_to_the_router(tmp_path):
    """`tandem up --api_keys_file`: its router wants a key on the API and leaves /health open."""
    p = run("apikey", "--tenant=me")
    key = re.search(r"^  (tdm-\S+)$", p.stdout, re.M).group(1)
    keys = tmp_path / "keys"
    keys.write_text(re.search(r"^  (me sha256:.*)$", p.stdout, re.M).group(1) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    up = subprocess.Popen([str(BIN), "up", "--http_port=0", "--grpc_port=0", "--aggregated",
                           f"--api_keys_file={keys}"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    try:
        port = None
        for line in up.stdout:
            lines.append(line)
            if "OpenAI HTTP API: http://127.0.0.1:" in line:
                port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
            if "Ctrl-C stops the cluster" in line:
                break
        assert port, "".join(lines)
        assert 'Authorization: Bearer $API_KEY' in "".join(lines)

        def get(headers):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return response.status
            except urllib.error.HTTPError as error:
                return error.code
        assert get({}) == 401
        assert get({"Authorization": f"Bearer {key}"}) == 200
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=30)
        assert up.returncode == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def test_up_tls_serves_https_and_grpc_with_a_throwaway_ca(tmp_path):
    """`tandem up --tls`: the router's HTTPS and gRPC APIs present a certificate for 127.0.0.1
    that Python's ssl module verifies against the CA it prints (so the workers, which need the
    same chain for mutual TLS, joined); `tandem generate --tls_ca` reaches the gRPC API, and
    without the CA it is refused; the workers' /metrics are HTTPS with the same CA; the throwaway
    folder is gone once the cluster stops."""
    import ssl
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    env["TMPDIR"] = str(tmp_path)
    up = subprocess.Popen([str(BIN), "up", "--tls", "--http_port=0", "--grpc_port=0",
                           "--prefill_workers=1"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    try:
        port = grpc_port = ca = None
        metrics_ports = []
        for line in up.stdout:
            lines.append(line)
            if m := re.search(r"metrics port (\d+), https\)", line):
                metrics_ports.append(int(m.group(1)))
            if "OpenAI HTTP API: https://127.0.0.1:" in line:
                port = int(line.split("https://127.0.0.1:")[1].split("/")[0])
            if "gRPC API:" in line and "TLS" in line:
                grpc_port = int(line.split("127.0.0.1:")[1].split()[0])
            if "TLS CA:" in line:
                ca = line.split("TLS CA:")[1].split()[0]
            if "Ctrl-C stops the cluster" in line:
                break
        assert port and grpc_port and ca, "".join(lines)
        assert ca.startswith(str(tmp_path)), ca
        context = ssl.create_default_context(cafile=ca)
        request = urllib.request.Request(f"https://127.0.0.1:{port}/v1/models")
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            assert response.status == 200
            assert json.loads(response.read())["data"]
        for host in ("127.0.0.1", "localhost"):
            with socket.create_connection((host, grpc_port), timeout=10) as raw:
                with context.wrap_socket(raw, server_hostname=host) as tls:
                    assert tls.version() in ("TLSv1.2", "TLSv1.3")
        assert len(metrics_ports) == 2, "".join(lines)  # a prefill and a decode worker
        for metrics_port in metrics_ports:
            with urllib.request.urlopen(f"https://127.0.0.1:{metrics_port}/metrics", timeout=30,
                                        context=context) as response:
                assert b"tandem_worker_kv_blocks" in response.read()
        p = run("generate", f"--url=127.0.0.1:{grpc_port}", f"--tls_ca={ca}", "--prompt=Hello",
                "--max_tokens=4", env=env)
        assert p.returncode == 0 and "generated: 4 tokens" in p.stderr, p.stderr
        p = run("generate", f"--url=127.0.0.1:{grpc_port}", "--prompt=Hello", "--max_tokens=4",
                env=env)
        assert p.returncode != 0, p.stderr
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=30)
        assert up.returncode == 0
        assert not os.path.exists(ca)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
