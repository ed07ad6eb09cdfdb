"""TLS everywhere (docs/security.md, "TLS"), end to end: a router, a prefill and a decode worker on
loopback, each started with --tls_cert/--tls_key/--tls_ca from a cluster CA made here with the
`openssl` command (an implementation no one here wrote), so every channel between them is mutual
TLS -- a remote prefill crosses router -> decode -> prefill.

grpcio's SSL credentials with the cluster CA reach the router's gRPC API; a client that trusts
another CA, a plaintext client, a client without a certificate and one whose certificate another
CA signed are all refused by a worker; `openssl s_client` sees TLS 1.2 and 1.3 and is refused at
TLS 1.1; a certificate replaced on disk is served without a restart (polled by its serial), and a key that does not match it is not.

A worker's /metrics with --metrics_tls: scraped over HTTPS by Python's ssl trusting the cluster CA
(what comes back passes `promtool check metrics`), plaintext refused on that port, a rotated
certificate served there without a restart."""
import http.client
import json
import os
import pathlib
import re
import shutil
import socket
import ssl
import subprocess

import grpc
import openai
import pytest

from cluster_common import BIN, Process, Protos, greedy_request, wait_until

UCX = {"UCX_TLS": "posix,self"}
WORKER_FLAGS = ["--listen=127.0.0.1:0", "--kv_cache_mb=64", "--threads=1", "--calibrate=false"]
OPENSSL = shutil.which("openssl")


def openssl(*args, cwd):
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(directory, name):
    """A self-signed CA: <name>-ca.key, <name>-ca.crt."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.crt", "-days", "2",
            "-subj", f"/CN={name} test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)
    return directory / f"{name}-ca.crt"


def make_leaf(directory, ca, name, san="IP:127.0.0.1,DNS:localhost"):
    """<name>.key, <name>.crt signed by CA `ca` (a make_ca name), for 127.0.0.1 and localhost,
    usable as a server and a client certificate. Returns (cert, key) paths."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=directory)
    (directory / f"{name}.ext").write_text(
        f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n"
        "basicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}-ca.crt", "-CAkey", f"{ca}-ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
            cwd=directory)
    return directory / f"{name}.crt", directory / f"{name}.key"


def serial_of(path):
    out = subprocess.run([OPENSSL, "x509", "-noout", "-serial", "-in", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip().split("=")[1], 16)


def served_serial(port, ca):
    """The serial of the certificate served on `port` (verified against `ca`), or None when no
    handshake completes."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2", "http/1.1"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None
    pem = ssl.DER_cert_to_PEM_cert(der)
    out = subprocess.run([OPENSSL, "x509", "-noout", "-serial"], input=pem, capture_output=True,
                         text=True, check=True).stdout
    return int(out.strip().split("=")[1], 16)


class Certs:
    def __init__(self, directory):
        self.dir = directory
        self.ca = make_ca(directory, "cluster")
        self.cert, self.key = make_leaf(directory, "cluster", "node")
        self.client_cert, self.client_key = make_leaf(directory, "cluster", "client")
        self.rogue_ca = make_ca(directory, "rogue")
        self.rogue_cert, self.rogue_key = make_leaf(directory, "rogue", "rogue")

    def flags(self, cert=None, key=None, reload_s=10):
        return [f"--tls_cert={cert or self.cert}", f"--tls_key={key or self.key}",
                f"--tls_ca={self.ca}", f"--tls_reload_s={reload_s}"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    assert OPENSSL, "the openssl command is missing (scripts/setup.sh installs it)"
    return Certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def cluster(certs):
    # The router's own pair lives in files of its own, which the rotation test replaces.
    router_cert, router_key = certs.dir / "router.crt", certs.dir / "router.key"
    shutil.copy(certs.cert, router_cert)
    shutil.copy(certs.key, router_key)
    procs = []
    try:
        prefill = Process("tandem-prefill", *WORKER_FLAGS, "--worker_id=tls-p0", *certs.flags(),
                          env=UCX)
        procs.append(prefill)
        decode = Process("tandem-decode", *WORKER_FLAGS, "--worker_id=tls-d0", *certs.flags(),
                         env=UCX)
        procs.append(decode)
        router = Process("tandem-router", "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0",
                         f"--workers={prefill.address},{decode.address}",
                         "--local_prefill_threshold=16",
                         *certs.flags(router_cert, router_key, reload_s=1))
        procs.append(router)
        # Both workers joined: their WatchState streams (mutual TLS) are up.
        wait_until(lambda: sum(" joined (" in l for l in router.log) >= 2, timeout=120,
                   what="both workers to join the router over mutual TLS")
        line = next(l for l in router.log if "listening on port " in l)
        https_port = int(line.split("(http port ")[1].split(",")[0])
        wait_until(lambda: https_get(https_port, "/health", certs.ca)[0] == 200, timeout=60,
                   what="GET https://.../health to answer 200")
        yield {"router": router, "prefill": prefill, "decode": decode, "https_port": https_port,
               "router_cert": router_cert, "router_key": router_key}
    finally:
        for p in procs:
            p.stop()


def https_get(port, path, ca):
    """(status, body) of GET https://127.0.0.1:port/path checked against `ca`; (0, error) when
    no response comes."""
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    except (OSError, ssl.SSLError, http.client.HTTPException) as error:
        return 0, str(error)
    finally:
        conn.close()


def tls_channel(port, ca, cert=None, key=None):
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pathlib.Path(ca).read_bytes(),
        private_key=pathlib.Path(key).read_bytes() if key else None,
        certificate_chain=pathlib.Path(cert).read_bytes() if cert else None)
    return grpc.secure_channel(f"127.0.0.1:{port}", credentials)


def health(channel, timeout=10):
    """grpc.health.v1 Check over `channel`: the raw answer, or the grpc.RpcError."""
    check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
    try:
        return check(b"", timeout=timeout)
    except grpc.RpcError as error:
        return error


SERVING = b"\x08\x01"


def test_generate_over_tls_with_a_remote_prefill(certs, cluster):
    pb = Protos()
    with tls_channel(cluster["router"].port, certs.ca) as channel:
        stub = pb.inference_grpc.InferenceStub(channel)
        # Long enough (> --local_prefill_threshold) to be prefilled on the prefill worker: the
        # decode worker's channel to it is mutual TLS too.
        prompt = "The quick brown fox jumps over the lazy dog. " * 8
        last, text = None, ""
        for response in stub.Generate(greedy_request(pb, prompt, 8), timeout=120):
            text += response.text
            if response.finish_reason:
                last = response
    assert last is not None and last.usage.completion_tokens == 8, last
    assert text
    assert last.timings.remote_prefill and last.timings.prefill_worker == "tls-p0", last.timings


def test_openai_sdk_over_https(certs, cluster):
    # The SDK's own HTTP client, trusting the cluster CA only.
    verify = ssl.create_default_context(cafile=str(certs.ca))
    with openai.DefaultHttpxClient(verify=verify) as http_client:
        client = openai.OpenAI(base_url=f"https://127.0.0.1:{cluster['https_port']}/v1",
                               api_key="none", http_client=http_client)
        model = client.models.list().data[0].id
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
            temperature=0)
        assert chat.choices[0].message.content
        assert chat.usage.completion_tokens > 0
        # Streamed too (server-sent events over TLS).
        stream = client.completions.create(model=model, prompt="Once upon a time",
                                           max_tokens=8, temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in stream if c.choices)


def test_many_streams_at_once_over_https_all_end(certs, cluster):
    """32 streamed completions at once through the SDK: every one ends with its usage and
    [DONE] (libevent's own OpenSSL bufferevents under evhttp lost the ends of some; see
    common/https_terminator.h)."""
    import asyncio

    async def run():
        verify = ssl.create_default_context(cafile=str(certs.ca))
        async with openai.DefaultAsyncHttpxClient(verify=verify) as http_client:
            client = openai.AsyncOpenAI(base_url=f"https://127.0.0.1:{cluster['https_port']}/v1",
                                        api_key="none", http_client=http_client, max_retries=0)
            model = (await client.models.list()).data[0].id

            async def one(i):
                stream = await client.completions.create(
                    model=model, prompt=f"Count: {i}", max_tokens=8, temperature=0,
                    stream=True, stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True}, timeout=60)
                pieces, usage = 0, None
                async for chunk in stream:
                    pieces += sum(1 for c in chunk.choices if c.text)
                    usage = chunk.usage or usage
                return pieces, usage and usage.completion_tokens

            return await asyncio.gather(*(one(i) for i in range(32)))

    results = asyncio.run(run())
    assert all(tokens == 8 and pieces > 0 for pieces, tokens in results), results


def test_plain_http_to_the_https_port_gets_no_answer(certs, cluster):
    conn = http.client.HTTPConnection("127.0.0.1", cluster["https_port"], timeout=10)
    with pytest.raises((OSError, http.client.HTTPException)):
        conn.request("GET", "/health")
        conn.getresponse().read()
    conn.close()
    assert https_get(cluster["https_port"], "/health", certs.ca)[0] == 200


@pytest.mark.parametrize("api", ["grpc", "https"])
def test_a_client_that_trusts_another_ca_is_refused(certs, cluster, api):
    if api == "grpc":
        with tls_channel(cluster["router"].port, certs.rogue_ca) as channel:
            answer = health(channel)
        assert isinstance(answer, grpc.RpcError), answer
        assert answer.code() == grpc.StatusCode.UNAVAILABLE, answer
    else:
        status, error = https_get(cluster["https_port"], "/health", certs.rogue_ca)
        assert status == 0 and "CERTIFICATE_VERIFY_FAILED" in error, error


@pytest.mark.parametrize("worker", ["decode", "prefill"])
def test_a_worker_takes_only_clients_with_a_cluster_certificate(certs, cluster, worker):
    port = cluster[worker].port
    # The cluster's own client certificate: served (the positive control).
    with tls_channel(port, certs.ca, certs.client_cert, certs.client_key) as channel:
        assert health(channel) == SERVING
    # No certificate, one from another CA, or no TLS at all: refused.
    for cert, key in [(None, None), (certs.rogue_cert, certs.rogue_key)]:
        with tls_channel(port, certs.ca, cert, key) as channel:
            answer = health(channel)
        assert isinstance(answer, grpc.RpcError), (cert, answer)
        assert answer.code() == grpc.StatusCode.UNAVAILABLE, (cert, answer)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = health(channel)
    assert isinstance(answer, grpc.RpcError) and answer.code() == grpc.StatusCode.UNAVAILABLE


def s_client(port, ca, *flags):
    """(exit status, output) of openssl s_client's handshake with `port`."""
    result = subprocess.run(
        [OPENSSL, "s_client", "-connect", f"127.0.0.1:{port}", "-CAfile", str(ca),
         "-alpn", "h2", "-brief", *flags], input="", capture_output=True, text=True,
        errors="replace", timeout=30)
    return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize("api", ["grpc", "https"])
def test_tls_versions(certs, cluster, api):
    port = cluster["router"].port if api == "grpc" else cluster["https_port"]
    for version, name in [("-tls1_3", "TLSv1.3"), ("-tls1_2", "TLSv1.2")]:
        code, out = s_client(port, certs.ca, version)
        assert code == 0, out
        assert re.search(rf"Protocol version: {re.escape(name)}", out), out
        assert "Verification: OK" in out, out
    # TLS 1.1 (allowed on this client's side by security level 0, so its hello goes out): the
    # server ends the handshake (gRPC closes the connection without an alert; OpenSSL's server
    # sends protocol_version).
    code, out = s_client(port, certs.ca, "-tls1_1", "-cipher", "DEFAULT:@SECLEVEL=0")
    assert code != 0, out
    assert "no protocols available" not in out, out  # the client's own refusal would say so
    assert "Protocol version" not in out, out
    assert re.search(r"unexpected eof|alert protocol version", out), out


def test_a_rotated_certificate_is_served_without_a_restart(certs, cluster):
    port, https_port = cluster["router"].port, cluster["https_port"]
    before = served_serial(port, certs.ca)
    assert before == serial_of(cluster["router_cert"])
    assert served_serial(https_port, certs.ca) == before
    new_cert, new_key = make_leaf(certs.dir, "cluster", "router-next")
    assert serial_of(new_cert) != before
    # A key that is not the certificate's: refused, the old pair stays in use.
    os.replace(shutil.copy(certs.rogue_key, f"{cluster['router_key']}.next"), cluster["router_key"])
    wait_until(lambda: any("do not load" in l for l in cluster["router"].log), timeout=30,
               what="the router to log that the new TLS files do not load")
    assert served_serial(https_port, certs.ca) == before
    assert https_get(https_port, "/health", certs.ca)[0] == 200
    # As a Secret volume does it: both files at once (renamed over the old ones).
    shutil.copy(new_key, f"{cluster['router_key']}.next")
    shutil.copy(new_cert, f"{cluster['router_cert']}.next")
    os.replace(f"{cluster['router_key']}.next", cluster["router_key"])
    os.replace(f"{cluster['router_cert']}.next", cluster["router_cert"])
    for p in (port, https_port):
        wait_until(lambda: served_serial(p, certs.ca) == serial_of(new_cert), timeout=30,
                   interval=0.1, what=f"the router to serve the new certificate on port {p}")
    # And both APIs still work through it.
    with tls_channel(port, certs.ca) as channel:
        assert health(channel) == SERVING
    assert https_get(https_port, "/health", certs.ca)[0] == 200


@pytest.fixture(scope="module")
def metrics_worker(certs):
    """A prefill worker with --metrics_tls, its pair in files of its own (the rotation test
    replaces them) checked every second; its metrics port is read from its start-up line."""
    cert, key = certs.dir / "metrics.crt", certs.dir / "metrics.key"
    shutil.copy(certs.cert, cert)
    shutil.copy(certs.key, key)
    worker = Process("tandem-prefill", *WORKER_FLAGS, "--worker_id=tls-m0",
                     "--metrics_listen=127.0.0.1:0", "--metrics_tls",
                     *certs.flags(cert, key, reload_s=1), env=UCX)
    try:
        line = next(l for l in worker.log if "listening on port " in l)
        match = re.search(r"metrics port (\d+), https\)", line)
        assert match, line
        yield {"worker": worker, "port": int(match.group(1)), "cert": cert, "key": key}
    finally:
        worker.stop()


def test_worker_metrics_over_https_trusting_the_cluster_ca(certs, metrics_worker):
    port = metrics_worker["port"]
    # No client certificate: a scraper only checks the server against the cluster CA.
    status, text = https_get(port, "/metrics", certs.ca)
    assert status == 200, text
    assert "tandem_worker_kv_blocks" in text
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=60)
    # Exit 3 lists lint problems: only the colons of vLLM's names are allowed (workers_test.py).
    problems = [l for l in (check.stdout + check.stderr).splitlines() if l.strip()]
    assert check.returncode in (0, 3), problems
    assert all(p.startswith("vllm:") and "should not contain ':'" in p for p in problems), problems
    # A client that trusts another CA is refused.
    assert https_get(port, "/metrics", certs.rogue_ca)[0] == 0
    # TLS 1.2 and 1.3 only, as on every other port (test_tls_versions).
    for version, name in [("-tls1_3", "TLSv1.3"), ("-tls1_2", "TLSv1.2")]:
        code, out = s_client(port, certs.ca, version)
        assert code == 0 and f"Protocol version: {name}" in out, out
    code, out = s_client(port, certs.ca, "-tls1_1", "-cipher", "DEFAULT:@SECLEVEL=0")
    assert code != 0 and "no protocols available" not in out, out
    assert "Protocol version" not in out, out


def test_plain_http_to_the_metrics_port_gets_no_answer(certs, metrics_worker):
    conn = http.client.HTTPConnection("127.0.0.1", metrics_worker["port"], timeout=10)
    with pytest.raises((OSError, http.client.HTTPException)):
        conn.request("GET", "/metrics")
        conn.getresponse().read()
    conn.close()
    assert https_get(metrics_worker["port"], "/metrics", certs.ca)[0] == 200


def test_a_rotated_metrics_certificate_is_served_without_a_restart(certs, metrics_worker):
    port, cert, key = metrics_worker["port"], metrics_worker["cert"], metrics_worker["key"]
    before = served_serial(port, certs.ca)
    assert before == serial_of(cert)
    new_cert, new_key = make_leaf(certs.dir, "cluster", "metrics-next")
    # As a Secret volume does it: both files at once (renamed over the old ones).
    shutil.copy(new_key, f"{key}.next")
    shutil.copy(new_cert, f"{cert}.next")
    os.replace(f"{key}.next", key)
    os.replace(f"{cert}.next", cert)
    wait_until(lambda: served_serial(port, certs.ca) == serial_of(new_cert), timeout=30,
               interval=0.1, what="the worker to serve the new certificate on its metrics port")
    assert https_get(port, "/metrics", certs.ca)[0] == 200
    assert metrics_worker["worker"].proc.poll() is None


def test_bad_metrics_tls_flags_stop_a_worker_with_a_message(certs):
    cases = [
        (["--metrics_tls"], "--metrics_tls needs --metrics_listen"),
        (["--metrics_tls", "--metrics_listen=127.0.0.1:0"], "--metrics_tls needs --tls_cert"),
    ]
    for flags, message in cases:
        result = subprocess.run([str(BIN / "tandem-prefill"), *WORKER_FLAGS, *flags],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 1, (flags, result.stderr)
        assert message in result.stderr, (flags, result.stderr)


def test_bad_tls_flags_stop_a_process_with_a_message(certs):
    cases = [
        ([f"--tls_cert={certs.cert}"], "together"),
        ([f"--tls_cert={certs.cert}", f"--tls_key={certs.rogue_key}"], "is not the key of"),
        ([f"--tls_cert={certs.dir}/missing.crt", f"--tls_key={certs.key}"], "cannot be read"),
        ([f"--tls_cert={certs.key}", f"--tls_key={certs.key}"], "no PEM certificate"),
        ([f"--tls_ca={certs.key}"], "no PEM certificate"),
        ([f"--tls_ca={certs.ca}", "--tls_reload_s=0"], "--tls_reload_s"),
    ]
    for flags, message in cases:
        result = subprocess.run([str(BIN / "tandem-router"), "--workers=127.0.0.1:1",
                                 "--listen=127.0.0.1:0", "--http_listen=", *flags],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 1, (flags, result.stderr)
        assert message in result.stderr, (flags, result.stderr)


def test_the_router_checks_the_name_in_a_workers_certificate(certs):
    """A worker whose certificate names only worker.tandem.test (no IP): a router that dials its
    IP refuses it (gRPC's hostname check fails the handshake, the worker never joins); a router told
    --tls_server_name=worker.tandem.test accepts it."""
    cert, key = make_leaf(certs.dir, "cluster", "named-worker", san="DNS:worker.tandem.test")
    worker = Process("tandem-decode", *WORKER_FLAGS, "--worker_id=tls-named",
                     *certs.flags(cert, key), env=UCX)
    routers = []
    try:
        # gRPC logs a failed handshake's reason at debug verbosity only.
        for extra, env in (([], {"GRPC_VERBOSITY": "debug"}),
                           (["--tls_server_name=worker.tandem.test"], {})):
            routers.append(Process("tandem-router", "--listen=127.0.0.1:0", "--http_listen=",
                                   f"--workers={worker.address}", *certs.flags(), *extra,
                                   env=env))
        refused, accepted = routers
        wait_until(lambda: any("Hostname Verification Check failed" in l for l in refused.log),
                   timeout=60, what="the router to refuse the worker's certificate for its IP")
        wait_until(lambda: any(" joined (" in l for l in accepted.log), timeout=60,
                   what="the worker to join the router that checks its DNS name")
        assert not any(" joined (" in l for l in refused.log), "".join(refused.log)
    finally:
        for p in routers + [worker]:
            p.stop()


def test_a_stream_in_flight_over_https_ends_whole_when_the_router_drains(certs, cluster):
    """SIGTERM while a streamed completion runs over HTTPS: the router drains, and the reply's
    end (usage, [DONE]) still reaches the client through the TLS relay before it exits."""
    import signal
    import threading
    router = Process("tandem-router", "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0",
                     f"--workers={cluster['decode'].address}", *certs.flags())
    try:
        line = next(l for l in router.log if "listening on port " in l)
        port = int(line.split("(http port ")[1].split(",")[0])
        wait_until(lambda: https_get(port, "/health", certs.ca)[0] == 200, timeout=60,
                   what="the second router's /health over HTTPS")
        started, result = threading.Event(), {}

        def stream():
            verify = ssl.create_default_context(cafile=str(certs.ca))
            with openai.DefaultHttpxClient(verify=verify) as http_client:
                client = openai.OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="none",
                                       http_client=http_client, max_retries=0)
                model = client.models.list().data[0].id
                chunks = client.completions.create(
                    model=model, prompt="Once upon a time", max_tokens=48, temperature=0,
                    stream=True, stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True}, timeout=60)
                for chunk in chunks:
                    started.set()
                    if chunk.usage:
                        result["tokens"] = chunk.usage.completion_tokens
                result["ended"] = True

        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        assert started.wait(60), "no chunk came"
        router.proc.send_signal(signal.SIGTERM)
        reader.join(60)
        assert result == {"tokens": 48, "ended": True}, result
        # It exits cleanly once the stream ended.
        assert router.proc.wait(timeout=30) == 0, "".join(router.log[-40:])
    finally:
        router.stop()


def test_a_large_request_body_crosses_the_tls_relay(certs, cluster):
    """A 3 MiB body (more than the relay holds before it pauses reading the client) arrives
    whole: the router reads all of it and answers that the prompt is too long for the model."""
    prompt = "hello " * (512 * 1024)  # 3 MiB
    context = ssl.create_default_context(cafile=str(certs.ca))
    conn = http.client.HTTPSConnection("127.0.0.1", cluster["https_port"], context=context,
                                       timeout=120)
    try:
        conn.request("POST", "/v1/completions",
                     body=json.dumps({"prompt": prompt, "max_tokens": 1}).encode(),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        body = json.loads(response.read())
    finally:
        conn.close()
    assert response.status == 400, body
    assert "error" in body and body["error"]["param"] in ("prompt", "max_tokens"), body
