"""Proof on real data: a real Prometheus server (Debian's `prometheus`) scrapes a `tandem up`
cluster under `tandem bench` load with the repository's scrape configs and rules, and every
recording rule, every alert expression and every dashboard panel query is evaluated through
Prometheus' HTTP API.

Two scrape jobs watch the same cluster:
- `tandem`: prometheus-local.yml's job, its targets written by tandem_up_targets.py from
  `tandem up`'s output (namespace "local");
- `tandem-k8s`: prometheus.yml's Kubernetes job with its relabelling unchanged, fed through a
  file the labels Kubernetes' pod discovery would give the cluster's pods (Debian's Prometheus is
  built without Kubernetes discovery), plus pods it must drop (namespace "k8s").
So the dashboards' variables find two namespaces, each with the three pools.

The load: remote prefills (prompts past the router's 256-token local-prefill threshold) with
shared prefixes (hits), under the slo policy (predictions, corrections) with objectives sent.
Everything is evaluated at one instant just after the load, once a scrape and a rule evaluation
have happened after it; the recording rules' and panels' 1-minute windows hold the whole run.
Panels are rendered to PNGs (into $TANDEM_MONITORING_PNG_DIR when set: that is how
docs/images/monitoring/ was made, with TANDEM_MONITORING_REQUESTS=120).
"""
import json
import math
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest
import yaml

ROOT = pathlib.Path(os.environ.get("TANDEM_SOURCE_DIR") or pathlib.Path(__file__).parents[2])
BIN_DIR = pathlib.Path(os.environ.get("TANDEM_BIN_DIR") or ROOT / "build" / "release" / "bin")
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
sys.path.insert(0, str(PROMETHEUS_DIR))
sys.path.insert(0, str(ROOT / "deploy" / "grafana"))
import render_panels  # noqa: E402
import tandem_up_targets  # noqa: E402

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
# Requests of the load, at 1.5/s (docs/images/monitoring/ was made with 120: a longer run than
# CI needs, whose curves have settled).
REQUESTS = int(os.environ.get("TANDEM_MONITORING_REQUESTS", "24"))
START_TIMEOUT_S = 150
# Panel queries that may return only NaN in a healthy run, and why. Everything else must return a
# series with a number.
NAN_ALLOWED = {
    ("tandem-router", "Admission queue wait"):
        "no request waits in the admission queue of an unloaded cluster: its histogram is empty "
        "and a quantile of nothing is NaN",
}
# Alerts that a healthy cluster must not raise.
SILENT_ALERTS = {"TandemTargetDown", "TandemWorkerUnhealthy", "TandemNoHealthyWorker",
                 "TandemKvCacheNearlyFull", "TandemMigrationStorm"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, condition, timeout_s, proc=None, log=lambda: ""):
    """Polls `condition` (cheap HTTP reads) until it returns something true; fails after
    timeout_s or when `proc` exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: the process exited with {proc.returncode}\n{log()}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout_s} s\n{log()}")
        time.sleep(0.1)


class Output:
    """A child's stdout+stderr, read on a thread; wait() for a line."""

    def __init__(self, proc):
        self.lines = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for line in stream:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.lines.append(None)
            self.cond.notify_all()

    def text(self):
        with self.cond:
            return "".join(l for l in self.lines if l is not None)

    def wait(self, needle, timeout_s):
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not any(l is not None and needle in l for l in self.lines):
                if None in self.lines:
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def workdir():
    path = pathlib.Path(tempfile.mkdtemp(prefix="tandem-monitoring-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    """`tandem up` with the slo policy on free ports: (http URL, its output text)."""
    assert os.access(BIN_DIR / "tandem", os.X_OK), f"{BIN_DIR}/tandem is missing: build first"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    proc = subprocess.Popen([str(BIN_DIR / "tandem"), "up", "--http_port=0", "--grpc_port=0",
                             "--policy=slo"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", env=env)
    out = Output(proc)
    try:
        if not out.wait("Ctrl-C stops the cluster", START_TIMEOUT_S):
            pytest.fail(f"`tandem up` did not become ready:\n{out.text()[-4000:]}")
        text = out.text()
        url = text.split("OpenAI HTTP API: ")[1].split("/v1")[0]
        yield url, text
    finally:
        stop(proc)


def kubernetes_pods(groups):
    """file_sd target groups carrying the labels Kubernetes' pod discovery gives: one "pod" per
    process of the local cluster (its address the pod's first declared container port, as the
    discovery sets it: the relabelling must move it to the annotated metrics port), and pods the
    job must drop. The pods are named as `tandem up` names the processes, since the router labels
    its per-worker gauges with the workers' ids, which on Kubernetes begin with the pod's name
    (the host name)."""
    pods = []
    for g in groups:
        host, port = g["targets"][0].rsplit(":", 1)
        pool = g["labels"]["pool"]
        pods.append({"targets": [f"{host}:1"], "labels": {
            "__meta_kubernetes_namespace": "k8s",
            "__meta_kubernetes_pod_name": g["labels"]["pod"],
            "__meta_kubernetes_pod_ip": host,
            "__meta_kubernetes_pod_node_name": "node-a",
            "__meta_kubernetes_pod_phase": "Running",
            "__meta_kubernetes_pod_label_app_kubernetes_io_name": "tandem",
            "__meta_kubernetes_pod_label_app_kubernetes_io_component": pool,
            "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
            "__meta_kubernetes_pod_annotation_prometheus_io_port": port,
            "__meta_kubernetes_pod_annotation_prometheus_io_path": "/metrics",
        }})
    base = pods[0]["labels"]
    drop = {
        "not annotated": {"__meta_kubernetes_pod_annotation_prometheus_io_scrape": "false"},
        "another app": {"__meta_kubernetes_pod_label_app_kubernetes_io_name": "other"},
        "not a pool": {"__meta_kubernetes_pod_label_app_kubernetes_io_component": "model-fetch"},
        "not running": {"__meta_kubernetes_pod_phase": "Pending"},
    }
    for i, (why, change) in enumerate(drop.items()):
        labels = dict(base, __meta_kubernetes_pod_name=f"drop-{i}", **change)
        pods.append({"targets": [f"127.0.0.1:{2 + i}"], "labels": labels})
    return pods, len(drop)


def prometheus_config(workdir, groups):
    """Both scrape jobs of the repository (see the module's docstring), scraping every second,
    with the repository's rule files, evaluated every second."""
    local = yaml.safe_load((PROMETHEUS_DIR / "prometheus-local.yml").read_text())
    k8s = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    (workdir / "targets").mkdir()
    (workdir / "targets" / "tandem-up.json").write_text(json.dumps(groups))
    pods, dropped = kubernetes_pods(groups)
    (workdir / "pods.json").write_text(json.dumps(pods))
    [local_job] = local["scrape_configs"]
    local_job["file_sd_configs"] = [{"files": [str(workdir / "targets" / "*.json")],
                                     "refresh_interval": "1s"}]
    # The plain job (the HTTPS jobs are prometheus_tls_test.py's).
    [k8s_job] = [j for j in k8s["scrape_configs"] if j["job_name"] == "tandem"]
    assert set(k8s_job) == {"job_name", "kubernetes_sd_configs", "relabel_configs"}, k8s_job
    del k8s_job["kubernetes_sd_configs"]
    k8s_job["job_name"] = "tandem-k8s"
    k8s_job["file_sd_configs"] = [{"files": [str(workdir / "pods.json")]}]
    assert local["rule_files"] == k8s["rule_files"]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(PROMETHEUS_DIR / f) for f in local["rule_files"]],
        "scrape_configs": [local_job, k8s_job],
    }
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path, dropped


@pytest.fixture(scope="module")
def prometheus(cluster, workdir):
    """A Prometheus server scraping the cluster: (client, targets file groups, decoys dropped)."""
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.fail("no prometheus server: scripts/setup.sh installs Debian's prometheus")
    groups = tandem_up_targets.targets_from_output(cluster[1])
    config, dropped = prometheus_config(workdir, groups)
    port = free_port()
    log = open(workdir / "prometheus.log", "w")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                             f"--storage.tsdb.path={workdir / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    client = render_panels.Prometheus(url)

    def ready():
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False
    try:
        wait_for("Prometheus /-/ready", ready, 60, proc,
                 lambda: (workdir / "prometheus.log").read_text())
        yield client, groups, dropped
    finally:
        stop(proc)
        log.close()


@pytest.fixture(scope="module")
def loaded(cluster, prometheus, workdir):
    """Every target scraped, then the load; (client, the evaluation instant, start of the load)."""
    client, groups, dropped = prometheus

    def all_up():
        data = client.get("/api/v1/targets", {"state": "any"})
        active = data["activeTargets"]
        return data if len(active) == 2 * len(groups) and all(
            t["health"] == "up" for t in active) else None
    targets = wait_for("every target scraped", all_up, 30)
    # The Kubernetes job: the annotated port and path, the labels the rules select on, and the
    # pods that are not Tandem's or not ready dropped.
    k8s = [t for t in targets["activeTargets"] if t["labels"]["job"] == "tandem-k8s"]
    local = {t["labels"]["pod"]: t for t in targets["activeTargets"]
             if t["labels"]["job"] == "tandem"}
    assert sorted(t["labels"]["pool"] for t in k8s) == sorted(g["labels"]["pool"] for g in groups)
    for t in k8s:
        labels = t["labels"]
        assert labels["namespace"] == "k8s" and labels["node"] == "node-a", labels
        twin = local[labels["pod"]]
        assert t["scrapeUrl"] == twin["scrapeUrl"], (t, twin)
        assert twin["labels"]["pool"] == labels["pool"]
    k8s_dropped = [t for t in targets["droppedTargets"]
                   if t["discoveredLabels"].get("job") == "tandem-k8s"]
    assert len(k8s_dropped) == dropped, k8s_dropped

    env = dict(os.environ, PYTHONPATH=str(ROOT / "bench"), TANDEM_BIN_DIR=str(BIN_DIR))
    start = time.time()
    bench = subprocess.run(
        [sys.executable, "-m", "tandem_bench", "--url", cluster[0], "--rate", "1.5",
         "--num-requests", str(REQUESTS), "--shared-prefix", "2,4,256", "--input-len", "24",
         "--output-len", "16", "--ttft-slo-ms", "20000", "--tpot-slo-ms", "2000", "--seed", "3",
         "--no-progress", "--result-json", str(workdir / "bench.json")],
        capture_output=True, text=True, env=env, timeout=150)
    assert bench.returncode == 0, bench.stdout + bench.stderr
    [run] = json.loads((workdir / "bench.json").read_text())["runs"]
    [point] = run["rates"]
    assert point["summary"]["completed"] == REQUESTS and point["summary"]["failed"] == 0, bench.stdout
    # Evaluate at an instant that the last scrape and rule evaluation have passed.
    at = time.time() + 1.0

    def evaluated_after():
        groups_ = client.get("/api/v1/rules", {})["groups"]
        return all(_unix(g["lastEvaluation"]) > at for g in groups_) and all(
            _unix(t["lastScrape"]) > at for t in client.get("/api/v1/targets", {})["activeTargets"])
    wait_for("a scrape and a rule evaluation after the load", evaluated_after, 30)
    return client, at, start


def _unix(rfc3339):
    """Seconds since the epoch of Prometheus' RFC 3339 timestamps (nanoseconds, Z or offset)."""
    from datetime import datetime
    text = rfc3339.replace("Z", "+00:00")
    head, _, tail = text.partition(".")
    if tail:
        digits = "".join(c for c in tail if c.isdigit())
        zone = tail[len(digits):]
        text = f"{head}.{digits[:6]}{zone}"
    return datetime.fromisoformat(text).timestamp()


def rules_of(kind):
    """(name, expression) of every recording rule (kind "record") or alert ("alert")."""
    out = []
    for path in sorted((PROMETHEUS_DIR / "rules").glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += [(r[kind], r["expr"]) for r in group["rules"] if kind in r]
    return out


def finite(result):
    return [s for s in result if not math.isnan(float(s["value"][1]))]


def test_every_recording_rule_returns_data(loaded):
    client, at, _ = loaded
    empty = []
    for name, expr in rules_of("record"):
        by_expr = client.query(expr, at)  # a parse error raises QueryError
        recorded = client.query(name, at)
        print(f"record {name}: {len(by_expr)} series, {len(finite(by_expr))} with a number")
        if not finite(by_expr) or not finite(recorded):
            empty.append(name)
    assert not empty, f"recording rules without data: {empty}"
    # Figures the load must have moved: requests, attainment, goodput, hits and transfers.
    def value(expr):
        [s] = client.query(expr, at)
        return float(s["value"][1])
    assert value('sum(namespace:tandem_router_requests:rate1m{namespace="local"})') > 0.1
    assert value('namespace:tandem_router_goodput:rate1m{namespace="local"}') > 0.1
    assert 0 < value('namespace:tandem_router_slo_attainment:ratio_rate1m{namespace="local"}') <= 1
    assert 0 < value('namespace:tandem_kv_prefix_hit:ratio_rate1m{namespace="local"}') < 1
    assert value('namespace:tandem_prefill_transfer_bytes:rate1m{namespace="local"}') > 0
    # Both scrape jobs see the same cluster: the same counters' totals.
    [local, k8s] = [value(f'sum(tandem_router_requests_total{{namespace="{ns}"}})')
                    for ns in ("local", "k8s")]
    assert local == k8s


def test_every_alert_expression_parses_and_a_healthy_cluster_raises_none_that_it_must_not(loaded):
    client, at, _ = loaded
    alerts = rules_of("alert")
    assert len(alerts) >= 6
    returned = {}
    for name, expr in alerts:
        returned[name] = client.query(expr, at)
        print(f"alert {name}: {len(returned[name])} series")
    noisy = {n: r for n, r in returned.items() if n in SILENT_ALERTS and r}
    assert not noisy, noisy
    firing = client.get("/api/v1/alerts", {})["alerts"]
    assert not [a for a in firing if a["labels"]["alertname"] in SILENT_ALERTS], firing


def test_every_dashboard_panel_query_returns_data(loaded):
    client, at, start = loaded
    boards = render_panels.load_dashboards()
    assert len(boards) == 5
    empty, checked = [], 0
    for uid, board in boards.items():
        # The cluster as each scrape job labels it; the variables find its pools and workers.
        for namespace in ("local", "k8s"):
            values = render_panels.resolve_variables(client, board, start, at,
                                                     {"namespace": namespace})
            if uid in ("tandem-prefill", "tandem-decode"):
                pool = uid.removeprefix("tandem-")
                assert values["pool"] == pool, values
                assert values["worker"] == f"{pool}-0", values
            else:
                assert values["pool"] == "(decode|prefill|router)", values
                assert values["worker"] == "(decode-0|prefill-0)", values
            for p, ref, expr in render_panels.panel_queries(board, values):
                result = client.query(expr, at)  # a parse error raises QueryError
                checked += 1
                ok = bool(finite(result)) or (bool(result) and (uid, p["title"]) in NAN_ALLOWED)
                if namespace == "local":
                    print(f"{uid} / {p['title']} {ref}: {len(result)} series, "
                          f"{len(finite(result))} with a number")
                if not ok:
                    empty.append(f"{uid} / {p['title']} {ref} ({namespace}): {expr}")
    assert not empty, "panel queries without data:\n" + "\n".join(empty)
    assert checked >= 100


def test_main_panels_render_to_pngs(loaded, workdir):
    client, at, start = loaded
    out = pathlib.Path(os.environ.get("TANDEM_MONITORING_PNG_DIR") or workdir / "png")
    paths = render_panels.render(client, render_panels.load_dashboards(), out, start - 5, at,
                                 step=1, chosen={"namespace": "local"})
    assert len(paths) == len(render_panels.MAIN_PANELS)
    for path in paths:
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and 10_000 < len(data) < 200_000, path
