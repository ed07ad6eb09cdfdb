"""API keys per tenant and their limits at the router's door (docs/security.md), end to end: a
router with --api_keys_file in front of one decode worker, driven by the `openai` SDK, raw HTTP and
grpcio. No key, a wrong key and a right one, over HTTP and gRPC; a key revoked and one added by
rewriting the file (no restart), and a malformed rewrite that keeps the keys in force; a tenant
over its concurrency or its requests per second gets 429 with Retry-After (gRPC
RESOURCE_EXHAUSTED with retry-after) while another tenant is served; /health and /metrics open by
default and /metrics closed by --auth_open_paths; no key's text in the router's log or metrics.

The key file's lines are written here with Python's hashlib (an implementation no one here
wrote), and one key comes from `tandem apikey`, whose line must agree with hashlib."""
import hashlib
import json
import os
import re
import secrets
import subprocess
import sys

import grpc
import openai
import pytest

from cluster_common import BIN, ROOT, Cluster, Process, Protos, http_request, wait_until

MODEL = "SmolLM2-135M-Instruct.Q4_1"


def key():
    return "tdm-" + secrets.token_urlsafe(32)


def line(tenant, k, limits=""):
    return f"{tenant} sha256:{hashlib.sha256(k.encode()).hexdigest()} {limits}".rstrip()


# alpha: one request at a time; beta: no limits; gamma: one request per 100 s (a burst of 1, so a
# second request is refused however slow the machine); old: revoked by the reload test.
ALPHA, BETA, GAMMA, OLD, NEW = key(), key(), key(), key(), key()
WRONG = key()
LINES = [
    "# tenants of the api_keys test",
    line("alpha", ALPHA, "concurrency=1"),
    line("beta", BETA) + "   # no limits",
    "",
    line("gamma", GAMMA, "rps=0.01"),
    line("old", OLD),
]


def write(path, text):
    """Replaces the key file at once, as an operator should (write, then rename over it)."""
    with open(f"{path}.next", "w") as f:
        f.write(text)
    os.replace(f"{path}.next", path)


def apikey_cli(tenant, *flags):
    """(key, line) printed by `tandem apikey`."""
    out = subprocess.run([str(BIN / "tandem"), "apikey", f"--tenant={tenant}", *flags],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    k = re.search(r"^  (tdm-\S+)$", out, re.M).group(1)
    file_line = re.search(r"^  (\S+ sha256:\S+.*)$", out, re.M).group(1)
    return k, file_line


CLI_KEY, CLI_LINE = apikey_cli("delta", "--rps=50", "--concurrency=4")


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "api_keys"
    write(path, "\n".join(LINES + [CLI_LINE]) + "\n")
    return path


@pytest.fixture(scope="module")
def cluster(keys_file):
    c = Cluster(prefill=0, decode=1, tag="keys-",
                router_flags=[f"--api_keys_file={keys_file}", "--api_keys_reload_ms=20"])
    yield c
    c.stop()


@pytest.fixture(scope="module")
def pb():
    return Protos()


def client(cluster, k):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{cluster.http_port}/v1", api_key=k,
                         max_retries=0)


def bearer(k):
    return {"Authorization": f"Bearer {k}"}


def metric(port, name, labels="", headers=None):
    """The value of one sample of the router's /metrics (0 when absent)."""
    status, text = http_request(port, "GET", "/metrics", headers=headers, timeout=10)
    assert status == 200, (status, text)
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def complete(c, **extra):
    return c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=2,
                                temperature=0, **extra)


def test_the_cli_line_is_sha256_of_its_key():
    assert CLI_LINE == line("delta", CLI_KEY, "rps=50 concurrency=4")


def test_http_needs_a_right_key(cluster):
    # None: 401 in OpenAI's shape, with the challenge of RFC 6750.
    for path, method in [("/v1/models", "GET"), ("/v1/completions", "POST"), ("/tokenize", "POST"),
                         ("/no/such/path", "GET")]:
        status, body = http_request(cluster.http_port, method, path, body={"prompt": "hi"})
        assert status == 401, (path, status, body)
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["code"] == "invalid_api_key"
        assert "Bearer" in body["error"]["message"]
    status, body = http_request(cluster.http_port, "GET", "/v1/models",
                                headers={"Authorization": f"Basic {ALPHA}"})
    assert status == 401, body
    # Wrong: the SDK's AuthenticationError.
    with pytest.raises(openai.AuthenticationError) as error:
        complete(client(cluster, WRONG))
    assert error.value.status_code == 401
    assert error.value.code == "invalid_api_key"
    assert error.value.response.headers["www-authenticate"] == "Bearer"
    assert WRONG not in str(error.value)
    # Right: served, for every tenant's key (the CLI's too).
    for k in (ALPHA, BETA, CLI_KEY):
        c = client(cluster, k)
        assert [m.id for m in c.models.list()] == [MODEL]
        assert complete(c).choices[0].finish_reason == "length"
    status, body = http_request(cluster.http_port, "POST", "/tokenize",
                                body={"prompt": "hello"}, headers=bearer(BETA))
    assert status == 200 and body["count"] > 0, body


def test_grpc_needs_a_right_key(cluster, pb):
    stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))
    request = pb.inference.GenerateRequest(
        prompt="hi", sampling=pb.inference.SamplingParams(max_tokens=2, temperature=0))
    for metadata in [None, [("authorization", f"Bearer {WRONG}")],
                     [("authorization", BETA)]]:  # no scheme
        with pytest.raises(grpc.RpcError) as error:
            list(stub.Generate(request, metadata=metadata, timeout=60))
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED, error.value
        for call, message in [(stub.Tokenize, pb.inference.TokenizeRequest(prompt="hi")),
                              (stub.ListModels, pb.inference.ListModelsRequest())]:
            with pytest.raises(grpc.RpcError) as error:
                call(message, metadata=metadata, timeout=60)
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    right = [("authorization", f"Bearer {BETA}")]
    responses = list(stub.Generate(request, metadata=right, timeout=60))
    assert sum(len(r.token_ids) for r in responses) == 2
    assert stub.Tokenize(pb.inference.TokenizeRequest(prompt="hi"), metadata=right).token_ids
    assert [m.id for m in stub.ListModels(pb.inference.ListModelsRequest(),
                                          metadata=right).models] == [MODEL]


def test_health_and_metrics_stay_open_by_default(cluster):
    assert http_request(cluster.http_port, "GET", "/health")[0] == 200
    assert metric(cluster.http_port, "tandem_router_auth_failures_total",
                  '{reason="missing"}') >= 1
    assert metric(cluster.http_port, "tandem_router_auth_failures_total", '{reason="wrong"}') >= 1
    assert metric(cluster.http_port, "tandem_router_tenant_requests_total",
                  '{outcome="admitted",tenant="beta"}') >= 3


def test_a_tenant_over_its_concurrency_gets_429_while_another_is_served(cluster):
    alpha = client(cluster, ALPHA)
    # Holds alpha's one place: a long stream, read to its first token and left open.
    stream = alpha.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to a thousand."}],
        max_tokens=2000, temperature=0, stream=True, extra_body={"ignore_eos": True})
    chunks = iter(stream)
    next(chunks)
    with pytest.raises(openai.RateLimitError) as error:
        complete(alpha)
    assert error.value.status_code == 429
    assert "concurrent requests" in error.value.message
    assert int(error.value.response.headers["retry-after"]) >= 1
    # Another tenant is unaffected.
    assert complete(client(cluster, BETA)).choices[0].finish_reason == "length"
    assert metric(cluster.http_port, "tandem_router_tenant_in_flight_requests",
                  '{tenant="alpha"}') == 1
    # The client goes away: its request is cancelled, which gives its place back.
    stream.close()
    wait_until(lambda: metric(cluster.http_port, "tandem_router_tenant_in_flight_requests",
                              '{tenant="alpha"}') == 0, timeout=60,
               what="alpha's cancelled stream to give its place back")
    assert complete(alpha).choices[0].finish_reason == "length"
    assert metric(cluster.http_port, "tandem_router_tenant_requests_total",
                  '{outcome="concurrency_limited",tenant="alpha"}') == 1


def test_a_tenant_over_its_rate_gets_429_with_retry_after(cluster, pb):
    gamma = client(cluster, GAMMA)
    assert [m.id for m in gamma.models.list()] == [MODEL]  # the bucket's one token
    with pytest.raises(openai.RateLimitError) as error:
        gamma.models.list()
    assert "requests per second" in error.value.message
    assert int(error.value.response.headers["retry-after"]) >= 90  # 1 token / 0.01 per s
    stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))
    with pytest.raises(grpc.RpcError) as error:
        stub.ListModels(pb.inference.ListModelsRequest(),
                        metadata=[("authorization", f"Bearer {GAMMA}")], timeout=60)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailers = dict(error.value.trailing_metadata())
    assert int(trailers["retry-after"]) >= 90
    request = pb.inference.GenerateRequest(
        prompt="hi", sampling=pb.inference.SamplingParams(max_tokens=2, temperature=0))
    with pytest.raises(grpc.RpcError) as error:
        list(stub.Generate(request, metadata=[("authorization", f"Bearer {GAMMA}")], timeout=60))
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert int(dict(error.value.trailing_metadata())["retry-after"]) >= 90
    assert complete(client(cluster, BETA)).choices[0].finish_reason == "length"
    assert metric(cluster.http_port, "tandem_router_tenant_requests_total",
                  '{outcome="rate_limited",tenant="gamma"}') == 3


def test_keys_are_revoked_and_added_by_rewriting_the_file(cluster, keys_file):
    assert len(client(cluster, OLD).models.list().data) == 1
    with pytest.raises(openai.AuthenticationError):
        client(cluster, NEW).models.list()

    def reloads():
        return metric(cluster.http_port, "tandem_router_api_key_reloads_total")

    def failures():
        return metric(cluster.http_port, "tandem_router_api_key_reload_failures_total")

    before = reloads()
    write(keys_file, "\n".join(LINES[:-1] + [line("new", NEW)]) + "\n")
    wait_until(lambda: reloads() > before, timeout=60, what="the key file's reload")
    with pytest.raises(openai.AuthenticationError):
        client(cluster, OLD).models.list()
    assert len(client(cluster, NEW).models.list().data) == 1

    # Malformed: the error is logged naming the line, counted, and the keys in force stay.
    failed = failures()
    write(keys_file, "\n".join(LINES[:-1] + ["broken sha256:1234", line("old", OLD)]) + "\n")
    wait_until(lambda: failures() > failed, timeout=60, what="the failed reload to be counted")
    assert any("line 6:" in l and "previous 4 keys stay in force" in l
               for l in cluster.router.log), cluster.logs()
    assert len(client(cluster, NEW).models.list().data) == 1
    with pytest.raises(openai.AuthenticationError):
        client(cluster, OLD).models.list()

    # Fixed again (with the CLI's key back): loaded.
    before = reloads()
    write(keys_file, "\n".join(LINES[:-1] + [line("new", NEW), CLI_LINE]) + "\n")
    wait_until(lambda: reloads() > before, timeout=60, what="the fixed key file's reload")
    assert metric(cluster.http_port, "tandem_router_api_keys") == 5
    assert len(client(cluster, CLI_KEY).models.list().data) == 1


def test_metrics_closed_by_auth_open_paths(cluster, keys_file):
    router = Process("tandem-router", "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0",
                     f"--workers={cluster.decode[0].address}", f"--api_keys_file={keys_file}",
                     "--auth_open_paths=/health")
    try:
        line_ = next(l for l in router.log if "listening on port " in l)
        port = int(line_.split("(http port ")[1].split(",")[0])
        status, body = http_request(port, "GET", "/metrics")
        assert status == 401, body
        assert metric(port, "tandem_router_api_keys", headers=bearer(BETA)) == 5
        assert http_request(port, "GET", "/health")[0] in (200, 503)  # open, ready or not
        assert b"tdm-" not in b"".join(l.encode() for l in router.log)
    finally:
        router.kill()


def test_a_malformed_file_stops_the_router_at_start(tmp_path):
    bad = tmp_path / "bad_keys"
    bad.write_text(f"{line('a', ALPHA)}\n\na {ALPHA}\n")
    run = subprocess.run([str(BIN / "tandem-router"), "--listen=127.0.0.1:0",
                          "--http_listen=127.0.0.1:0", "--workers=127.0.0.1:1",
                          f"--api_keys_file={bad}"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run
    assert "line 3:" in run.stderr, run.stderr
    assert ALPHA not in run.stdout + run.stderr


def client_env(**keys):
    """This environment without any API key variable, plus `keys`."""
    env = {k: v for k, v in os.environ.items() if k not in ("TANDEM_API_KEY", "OPENAI_API_KEY")}
    env.update(keys)
    return env


def generate(cluster, *flags, env):
    return subprocess.run([str(BIN / "tandem"), "generate", f"--url={cluster.grpc_address}",
                           "--prompt=The capital of France is", "--max_tokens=2", *flags],
                          capture_output=True, text=True, env=env, timeout=120)


def test_generate_sends_its_api_key(cluster):
    """`tandem generate --url`: refused without a key (a hint names where one comes from); served
    with --api_key, TANDEM_API_KEY or OPENAI_API_KEY, the flag first; the key never printed."""
    def admitted():
        return metric(cluster.http_port, "tandem_router_tenant_requests_total",
                      '{outcome="admitted",tenant="beta"}')

    runs = []
    none = generate(cluster, env=client_env())
    runs.append(none)
    assert none.returncode == 1, none
    assert "refused" in none.stderr and "TANDEM_API_KEY" in none.stderr, none.stderr
    before = admitted()
    for flags, env in [(["--api_key=" + BETA], client_env()),
                       ([], client_env(TANDEM_API_KEY=BETA)),
                       ([], client_env(OPENAI_API_KEY=BETA)),
                       ([], client_env(TANDEM_API_KEY=BETA, OPENAI_API_KEY=WRONG))]:
        served = generate(cluster, *flags, env=env)
        runs.append(served)
        assert served.returncode == 0, (flags, served.stderr)
        assert "generated: 2 tokens" in served.stderr, served.stderr
    # Counted against beta by the router: the key reached it as beta's.
    assert admitted() == before + 4
    # The flag wins over the environment: a wrong flag is refused with a right variable.
    wrong = generate(cluster, "--api_key=" + WRONG, env=client_env(OPENAI_API_KEY=BETA))
    runs.append(wrong)
    assert wrong.returncode == 1 and "invalid API key" in wrong.stderr, wrong.stderr
    # A key that cannot be metadata: a usage error that does not print it.
    spaced = generate(cluster, env=client_env(TANDEM_API_KEY=BETA + " x"))
    runs.append(spaced)
    assert spaced.returncode == 2 and "printable ASCII" in spaced.stderr, spaced.stderr
    # In this process no key is needed, so one given is a mistake, not ignored.
    local = subprocess.run([str(BIN / "tandem"), "generate", "--prompt=hi", "--max_tokens=1"],
                           capture_output=True, text=True, env=client_env(TANDEM_API_KEY=BETA),
                           timeout=120)
    runs.append(local)
    assert local.returncode == 2 and "--api_key" in local.stderr, local.stderr
    for run in runs:
        assert BETA not in run.stdout + run.stderr and WRONG not in run.stdout + run.stderr


def bench(cluster, protocol, *flags, env, tmp_path):
    """`tandem bench` (as `python -m tandem_bench`) at the router: three short requests."""
    url = (f"http://127.0.0.1:{cluster.http_port}" if protocol == "openai"
           else cluster.grpc_address)
    result = tmp_path / f"{protocol}.json"
    run = subprocess.run(
        [sys.executable, "-m", "tandem_bench", "--url", url, "--protocol", protocol,
         "--num-requests", "3", "--rate", "inf", "--input-len", "8", "--output-len", "2",
         "--no-progress", "--result-json", str(result), *flags],
        capture_output=True, text=True, timeout=240,
        env=dict(env, PYTHONPATH=str(ROOT / "bench"), TANDEM_BIN_DIR=str(BIN)))
    return run, result


@pytest.mark.parametrize("protocol", ["openai", "grpc"])
def test_bench_sends_its_api_key(cluster, protocol, tmp_path):
    """`tandem bench`: its warm-up refused without a key (401 / UNAUTHENTICATED named); every
    request served with --api-key or TANDEM_API_KEY; the key in neither output nor result JSON."""
    refused, _ = bench(cluster, protocol, env=client_env(), tmp_path=tmp_path)
    assert refused.returncode != 0
    assert ("HTTP 401" if protocol == "openai" else "UNAUTHENTICATED") in refused.stderr, \
        refused.stderr
    for flags, env in [(["--api-key", BETA], client_env(OPENAI_API_KEY=WRONG)),
                       ([], client_env(TANDEM_API_KEY=BETA))]:
        run, result = bench(cluster, protocol, *flags, env=env, tmp_path=tmp_path)
        assert run.returncode == 0, run.stderr
        text = result.read_text()
        assert BETA not in run.stdout + run.stderr + text
        data = json.loads(text)
        assert data["config"]["api_key_sent"] is True and "api_key" not in data["config"]
        requests = data["runs"][0]["rates"][0]["requests"]
        assert len(requests) == 3 and all(r["ok"] for r in requests), requests
        if flags:
            assert data["command"][data["command"].index("--api-key") + 1] == "<redacted>"


def test_no_key_appears_in_the_log_or_the_metrics(cluster):
    status, text = http_request(cluster.http_port, "GET", "/metrics")
    assert status == 200
    log = "".join(cluster.router.log)
    assert "tdm-" not in text and "tdm-" not in log
    for k in (ALPHA, BETA, GAMMA, OLD, NEW, WRONG, CLI_KEY):
        digest = hashlib.sha256(k.encode()).hexdigest()
        assert k not in log and digest not in log and k not in text and digest not in text
