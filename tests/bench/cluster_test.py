"""The cluster side: `tandem up` flags, Prometheus text parsing, the prefix-hit arithmetic of a
disaggregated cluster, and LocalCluster against a fake `tandem` that prints what `tandem up` prints
(so start-up, address parsing, the health wait and the SIGTERM stop are checked without a build)."""
import http.server
import os
import stat
import sys
import textwrap
import threading

import pytest

from tandem_bench import cluster


def test_up_flags():
    assert cluster.parse_up_flags("aggregated, decode_workers=2  --policy=kv_aware") == [
        "--aggregated", "--decode_workers=2", "--policy=kv_aware"]
    assert cluster.parse_up_flags("") == []
    for bad in ("bad!flag", "x=", "=3"):
        with pytest.raises(ValueError):
            cluster.parse_up_flags(bad)


class MetricsServer:
    """Serves `self.text` at /metrics on a free port, in a thread; over TLS with `context` (an
    ssl server context)."""

    def __init__(self, text="", context=None):
        self.text = text
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = owner.text.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if context is not None:
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        scheme = "https" if context is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}/metrics"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def worker_page(hits, prompts, prefill=False):
    page = textwrap.dedent(f"""\
        # HELP tandem_worker_prompt_tokens_total prompt tokens received
        # TYPE tandem_worker_prompt_tokens_total counter
        tandem_worker_prompt_tokens_total {prompts}
        tandem_worker_prefix_hit_tokens_total {hits}
        tandem_worker_kv_blocks{{state="free"}} 10
        tandem_worker_kv_blocks{{state="used"}} 5
        """)
    if prefill:
        page += 'tandem_prefill_requests_total{outcome="ok"} 3\n'
    return page


def test_scrape_sums_series_and_skips_comments():
    server = MetricsServer(worker_page(4, 100))
    try:
        values = cluster.scrape(server.url)
    finally:
        server.close()
    assert values["tandem_worker_prompt_tokens_total"] == 100
    assert values["tandem_worker_kv_blocks"] == 15
    assert not any(k.startswith("#") for k in values)


def test_prefix_hit_rate_of_a_disaggregated_cluster():
    decode = MetricsServer(worker_page(hits=10, prompts=100))
    prefill = MetricsServer(worker_page(hits=0, prompts=0))
    try:
        probe = cluster.PrefixHitProbe({"decode-0": decode.url, "prefill-0": prefill.url,
                                        "gone": "http://127.0.0.1:9/metrics"})
        probe.start()
        # 400 prompt tokens reached the decode worker, 160 of them hits; the 240 it lacked went to
        # the prefill worker, which found 80 of them in its own cache.
        decode.text = worker_page(hits=170, prompts=500)
        prefill.text = worker_page(hits=80, prompts=240, prefill=True)
        result = probe.stop()
    finally:
        decode.close()
        prefill.close()
    assert result["workers"]["decode-0"] == {"role": "decode", "hit_tokens": 160,
                                             "prompt_tokens": 400, "rate": 0.4}
    assert result["workers"]["prefill-0"]["role"] == "prefill"
    assert result["workers"]["gone"] is None
    # (160 + 80) of the 400 prompt tokens were not computed.
    assert result["rate"] == pytest.approx(240 / 400)
    assert result["prompt_tokens"] == 400


FAKE_TANDEM = r'''#!{python}
"""Prints what `tandem up` prints, serves /health, stops on SIGTERM."""
import http.server, signal, sys, threading

mode = "{mode}"
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
port = server.server_address[1]
print("args:", " ".join(sys.argv[1:]), flush=True)
if mode == "fail":
    print("error: a worker did not start", file=sys.stderr, flush=True)
    sys.exit(1)
print("[decode-0] tandem-decode decode-0 listening on port 4242 (model m, metrics port 5151)",
      file=sys.stderr, flush=True)
print("[prefill-0] tandem-prefill prefill-0 listening on port 4343 (model m, metrics port 5252)",
      file=sys.stderr, flush=True)
print(f"\ntandem cluster ready: 1 prefill + 1 decode worker(s), policy kv_aware\n"
      f"  OpenAI HTTP API: http://127.0.0.1:{{port}}/v1   (metrics: http://127.0.0.1:{{port}}/metrics)\n"
      f"  gRPC API:        127.0.0.1:7777 (tandem.v1.Inference)\n"
      f"  workers:         127.0.0.1:4343, 127.0.0.1:4242\n", flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
stop.wait(60)
print("stopping the cluster", flush=True)
'''


def fake_bin(tmp_path, mode):
    path = tmp_path / "tandem"
    path.write_text(FAKE_TANDEM.format(python=sys.executable, mode=mode))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return tmp_path


def test_local_cluster_start_and_stop(tmp_path):
    log = tmp_path / "cluster.log"
    c = cluster.LocalCluster(fake_bin(tmp_path, "ok"), ["--aggregated", "--http_port=0"],
                             timeout_s=30, log_path=log)
    with c:
        assert c.http_url.startswith("http://127.0.0.1:") and c.healthy()
        assert c.grpc_target == "127.0.0.1:7777"
        assert c.worker_metrics == {"decode-0": "http://127.0.0.1:5151/metrics",
                                    "prefill-0": "http://127.0.0.1:5252/metrics"}
        proc = c._proc
    assert proc.returncode == 0  # it exited on SIGTERM, by itself
    text = log.read_text()
    # The user's --http_port is kept; a free gRPC port is asked for; worker metrics are enabled.
    assert "args: up --aggregated --http_port=0 --grpc_port=0" in text
    assert "stopping the cluster" in text


def test_local_cluster_that_fails_shows_its_output(tmp_path):
    with pytest.raises(cluster.ClusterError, match="(?s)exited with status 1.*a worker did not start"):
        cluster.LocalCluster(fake_bin(tmp_path, "fail"), [], timeout_s=30).start()


def test_local_cluster_without_binaries(tmp_path):
    with pytest.raises(cluster.ClusterError, match="missing or not executable"):
        cluster.LocalCluster(tmp_path, []).start()


def test_metrics_listen_is_set_for_the_children(tmp_path, monkeypatch):
    # A TANDEM_METRICS_LISTEN of the user's with a fixed port would clash between workers.
    monkeypatch.setenv("TANDEM_METRICS_LISTEN", "0.0.0.0:9100")
    script = tmp_path / "tandem"
    script.write_text(f"#!{sys.executable}\nimport os, sys\n"
                      "print('env', os.environ['TANDEM_METRICS_LISTEN'], file=sys.stderr)\n"
                      "sys.exit(3)\n")
    script.chmod(0o755)
    with pytest.raises(cluster.ClusterError, match="env 127.0.0.1:0"):
        cluster.LocalCluster(tmp_path, [], timeout_s=30).start()
    assert os.environ["TANDEM_METRICS_LISTEN"] == "0.0.0.0:9100"


def test_local_cluster_reads_the_lines_of_tandem_up_tls():
    """`tandem up --tls` prints https:// URLs and the CA its clients must trust."""
    import io
    c = cluster.LocalCluster("/nonexistent", [])
    c._pump(io.StringIO(
        "  OpenAI HTTP API: https://127.0.0.1:4443/v1   (metrics: https://127.0.0.1:4443/metrics)\n"
        "  gRPC API:        127.0.0.1:7777 (tandem.v1.Inference, TLS)\n"
        "  TLS CA:          /tmp/tandem-tls-x/ca.crt (clients trust it: curl --cacert, ...)\n"
        "[decode-0] tandem-decode decode-0 listening on port 4242 (model m, metrics port 5151, "
        "https)\n"))
    assert c.http_url == "https://127.0.0.1:4443"
    # Its workers' /metrics are HTTPS (--metrics_tls).
    assert c.worker_metrics == {"decode-0": "https://127.0.0.1:5151/metrics"}
    assert c.grpc_target == "127.0.0.1:7777"
    assert c.ca_file == "/tmp/tandem-tls-x/ca.crt"


def test_the_prefix_hit_probe_scrapes_https_metrics_checked_against_the_ca(tmp_path):
    """A worker with --metrics_tls serves HTTPS: the probe reads it trusting the cluster's CA,
    and reads nothing from a server that CA did not sign. The server here is Python's own, with
    certificates made by the `openssl` command."""
    import shutil
    import ssl
    import subprocess
    openssl = shutil.which("openssl")
    assert openssl, "the openssl command is missing (scripts/setup.sh installs it)"
    for name in ("server", "other"):
        subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
                        "-out", f"{name}.crt", "-days", "1", "-subj", "/CN=test",
                        "-addext", "subjectAltName=IP:127.0.0.1"],
                       cwd=tmp_path, check=True, capture_output=True, timeout=60)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    server = MetricsServer(f"{cluster.PREFIX_HIT_METRIC} 7\n{cluster.PROMPT_TOKENS_METRIC} 20\n",
                           context=context)
    try:
        url = server.url
        assert cluster.scrape(url, ca_file=str(tmp_path / "server.crt")) == {
            cluster.PREFIX_HIT_METRIC: 7.0, cluster.PROMPT_TOKENS_METRIC: 20.0}
        probe = cluster.PrefixHitProbe({"decode-0": url}, ca_file=str(tmp_path / "other.crt"))
        assert probe._read() == {"decode-0": None}
        probe = cluster.PrefixHitProbe({"decode-0": url}, ca_file=str(tmp_path / "server.crt"))
        assert probe._read() == {"decode-0": (7.0, 20.0, False)}
    finally:
        server.close()
