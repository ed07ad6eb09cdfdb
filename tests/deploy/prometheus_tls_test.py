"""deploy/prometheus/prometheus.yml's HTTPS jobs on real processes: a real Prometheus server
(Debian's `prometheus`) runs the file's three jobs unchanged but for two things Kubernetes would
provide -- the pods (fed through a file with the labels Kubernetes' pod discovery gives, since
Debian's Prometheus is built without that discovery) and the cluster CA's path -- and scrapes a
worker with --metrics_tls and a router with HTTPS, each with a certificate that names only
tandem-worker / tandem-router (not the address scraped), made with the `openssl` command.

Both are scraped over HTTPS by their TLS job and labelled job="tandem" with their pool; a pod
without the https annotation stays with the plain job and is not in the TLS jobs; an HTTPS pod is
not in the plain job."""
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from monitoring_live_test import wait_for

ROOT = pathlib.Path(os.environ.get("TANDEM_SOURCE_DIR") or pathlib.Path(__file__).parents[2])
BIN = pathlib.Path(os.environ.get("TANDEM_BIN_DIR") or ROOT / "build" / "release" / "bin")
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"
UCX = {"UCX_TLS": "posix,self"}


def openssl(*args, cwd):
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(d):
    """ca.crt and, signed by it, worker.crt/key (DNS:tandem-worker) and router.crt/key
    (DNS:tandem-router): no IP address, so a scrape checks the configured server_name."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    for name in ("worker", "router"):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=tandem-{name}",
                cwd=d)
        (d / f"{name}.ext").write_text(f"subjectAltName=DNS:tandem-{name}\n"
                                       "extendedKeyUsage=serverAuth,clientAuth\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile",
                f"{name}.ext", cwd=d)


class Proc:
    """A process whose output lines are collected; `line(needle)` waits for one."""

    def __init__(self, args, env=None):
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=dict(os.environ, **(env or {})))
        self.lines = []

    def line(self, needle, timeout_s=120):
        deadline = time.monotonic() + timeout_s
        for line in self.proc.stdout:  # blocks on the next line; ends when the process does
            self.lines.append(line)
            if needle in line:
                # The rest is read on a thread, so that the process never blocks on a full pipe.
                threading.Thread(target=lambda: self.lines.extend(self.proc.stdout),
                                 daemon=True).start()
                return line
            if time.monotonic() > deadline:
                break
        pytest.fail(f"no line with {needle!r}:\n{''.join(self.lines)}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pod(name, component, port, https):
    labels = {
        "__meta_kubernetes_namespace": "k8s",
        "__meta_kubernetes_pod_name": name,
        "__meta_kubernetes_pod_ip": "127.0.0.1",
        "__meta_kubernetes_pod_node_name": "node-a",
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": "tandem",
        "__meta_kubernetes_pod_label_app_kubernetes_io_component": component,
        "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
        "__meta_kubernetes_pod_annotation_prometheus_io_port": str(port),
        "__meta_kubernetes_pod_annotation_prometheus_io_path": "/metrics",
    }
    if https:
        labels["__meta_kubernetes_pod_annotation_prometheus_io_scheme"] = "https"
    # Discovery's address is the first declared port; the relabelling moves it to the annotated one.
    return {"targets": ["127.0.0.1:1"], "labels": labels}


def get(url, path, params=None):
    query = "?" + urllib.parse.urlencode(params) if params else ""
    with urllib.request.urlopen(url + path + query, timeout=5) as r:
        return json.loads(r.read())["data"]


def test_the_https_jobs_scrape_a_worker_and_a_router_over_tls(tmp_path):
    for tool in (PROMETHEUS, OPENSSL):
        assert os.access(tool, os.X_OK), f"{tool} is missing (scripts/setup.sh installs it)"
    make_certs(tmp_path)
    procs = []
    try:
        worker = Proc([str(BIN / "tandem-prefill"), "--listen=127.0.0.1:0", "--kv_cache_mb=64",
                       "--threads=1", "--calibrate=false", "--worker_id=prom-tls",
                       "--metrics_listen=127.0.0.1:0", "--metrics_tls",
                       f"--tls_cert={tmp_path / 'worker.crt'}",
                       f"--tls_key={tmp_path / 'worker.key'}"], env=UCX)
        procs.append(worker)
        line = worker.line("listening on port ")
        assert line.rstrip().endswith(", https)"), line
        worker_port = int(line.split("metrics port ")[1].split(",")[0])
        router = Proc([str(BIN / "tandem-router"), "--listen=127.0.0.1:0",
                       "--http_listen=127.0.0.1:0", "--workers=127.0.0.1:1",
                       f"--tls_cert={tmp_path / 'router.crt'}",
                       f"--tls_key={tmp_path / 'router.key'}"])
        procs.append(router)
        line = router.line("listening on port ")
        router_port = int(line.split("(http port ")[1].split(",")[0])

        # The decoy: a plain pod (nothing listens on its port), the plain job's only target.
        pods = [pod("prefill-0", "prefill", worker_port, https=True),
                pod("router-0", "router", router_port, https=True),
                pod("decode-plain", "decode", free_port(), https=False)]
        (tmp_path / "pods.json").write_text(json.dumps(pods))
        config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
        for job in config["scrape_configs"]:
            assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
            job["file_sd_configs"] = [{"files": [str(tmp_path / "pods.json")]}]
            if "tls_config" in job:
                assert job["tls_config"]["ca_file"] == "/etc/prometheus/tandem-tls/ca.crt"
                job["tls_config"]["ca_file"] = str(tmp_path / "ca.crt")
        config["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s"}
        config.pop("rule_files")
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        prometheus = Proc([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                           f"--storage.tsdb.path={tmp_path / 'data'}",
                           f"--web.listen-address=127.0.0.1:{port}", "--log.level=info"])
        procs.append(prometheus)
        prometheus.line("Server is ready to receive web requests")
        url = f"http://127.0.0.1:{port}"

        def scraped():
            active = get(url, "/api/v1/targets", {"state": "active"})["activeTargets"]
            tls = [t for t in active if t["scrapePool"].startswith("tandem-tls-")]
            return active if len(tls) == 2 and all(t["health"] == "up" for t in tls) else None
        active = wait_for("the HTTPS targets scraped", scraped, 60, prometheus.proc,
                          log=lambda: json.dumps(get(url, "/api/v1/targets"), indent=1))
        by_pool = {(t["scrapePool"], t["labels"]["pod"]): t for t in active}
        assert set(by_pool) == {("tandem-tls-workers", "prefill-0"),
                                ("tandem-tls-router", "router-0"), ("tandem", "decode-plain")}
        for key, pool, port_ in [(("tandem-tls-workers", "prefill-0"), "prefill", worker_port),
                                 (("tandem-tls-router", "router-0"), "router", router_port)]:
            t = by_pool[key]
            assert t["scrapeUrl"] == f"https://127.0.0.1:{port_}/metrics", t
            assert t["labels"]["job"] == "tandem" and t["labels"]["pool"] == pool, t
        # The metrics themselves arrived, under the labels the rules select on.
        def series():
            result = get(url, "/api/v1/query", {"query": "tandem_worker_kv_blocks"})["result"]
            return result or None
        result = wait_for("a tandem_worker_kv_blocks series", series, 30)
        assert {r["metric"]["pool"] for r in result} == {"prefill"}
        assert {r["metric"]["job"] for r in result} == {"tandem"}
    finally:
        for p in reversed(procs):
            p.stop()
