"""The TLS overlay executed (deploy/k8s/overlays/tls), as k8s_executed_test.py executes the cpu
overlay: each workload's command and environment started as they are, one network namespace per
pod (two routers, one prefill and two decode workers), the probes the overlay declares run as the
kubelet runs them (TCP connects, /health over HTTPS). The Secrets the pods mount hold
certificates of a CA made here with the `openssl` command, named as the cert-manager example names
them (tandem-router; tandem-worker plus the pool's name), and a key file written with hashlib.

  a. The routers follow every worker: mutual TLS on every WatchState stream, each worker checked
     by the name tandem-worker though dialled by pod IP.
  b. A chat through a router over HTTPS (its certificate checked for tandem-router against the
     CA): 401 without an API key, served with one, its prompt prefilled remotely -- the decode pod
     reached the prefill pod over mutual TLS too; and over TLS gRPC with the key.
  c. Every pod's /metrics answers over HTTPS only, checked against the CA and the names
     Prometheus checks (tandem-router, tandem-worker).

Needs root, iproute2 and setpriv (k8s_pods.py); skipped, saying why, without them."""
import hashlib
import http.client
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import time

import grpc
import pytest

import k8s_pods
import k8s_render as k8s

k8s_pods.require_pods()

from cluster_common import BIN, Protos, greedy_request, wait_until  # noqa: E402
from k8s_executed_test import ENTRYPOINT, NAMESPACE, SMALL_MACHINE, metric, parse_metrics, \
    post_chat, prompt  # noqa: E402

OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"
KEY = "tdm-" + secrets.token_urlsafe(32)


def openssl(*args, cwd):
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_secrets(folder):
    """{Secret name: folder of its keys}: the three TLS Secrets (tls.crt, tls.key, ca.crt) of one
    CA, and tandem-api-keys (api_keys) letting KEY in."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=folder)
    out = {}
    for component, names in [("router", "DNS:tandem-router"),
                             ("prefill", "DNS:tandem-worker,DNS:tandem-prefill"),
                             ("decode", "DNS:tandem-worker,DNS:tandem-decode")]:
        secret = folder / f"tandem-{component}-tls"
        secret.mkdir()
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", str(secret / "tls.key"), "-out", f"{component}.csr",
                "-subj", f"/CN=tandem-{component}", cwd=folder)
        (folder / f"{component}.ext").write_text(
            f"subjectAltName={names}\nextendedKeyUsage=serverAuth,clientAuth\n")
        openssl("x509", "-req", "-in", f"{component}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", str(secret / "tls.crt"), "-days", "2",
                "-extfile", f"{component}.ext", cwd=folder)
        shutil.copy(folder / "ca.crt", secret / "ca.crt")
        out[secret.name] = secret
    keys = folder / "tandem-api-keys"
    keys.mkdir()
    (keys / "api_keys").write_text(f"k8s-test sha256:{hashlib.sha256(KEY.encode()).hexdigest()}\n")
    out[keys.name] = keys
    return out


class Cluster:
    def __init__(self, folder):
        self.ca = str(folder / "ca.crt")
        self.pods = k8s_pods.PodCluster(
            k8s.render("overlays/tls"), NAMESPACE,
            image_paths={k8s.ENTRYPOINT: ENTRYPOINT},
            mounts={"/models": k8s.ROOT / "models"},
            extra_env={"TANDEM_BIN_DIR": str(BIN)},
            overrides=SMALL_MACHINE, secrets=make_secrets(folder))
        self.pods.start(limit_s=150)
        try:
            self.routers = self.pods.endpoints("tandem-router")
            self.prefill = self.pods.of_role("prefill")
            self.decode = self.pods.of_role("decode")
            self.workers = self.prefill + self.decode
            self.forwarded = {(r.name, p): self.pods.node.forward(r.ports[p], ip=r.ip)
                              for r in self.routers for p in ("http", "grpc")}
        except BaseException:
            self.pods.close()
            raise

    def context(self):
        return ssl.create_default_context(cafile=self.ca)

    def metrics(self, pod):
        """/metrics over HTTPS, the certificate checked as Prometheus checks it."""
        port = pod.ports["http"] if pod.role == "router" else pod.ports["metrics"]
        name = "tandem-router" if pod.role == "router" else "tandem-worker"
        status, text = self.pods.https_get(pod, port, "/metrics", self.context(),
                                           server_hostname=name)
        assert status == 200, (pod.name, status, text)
        return text

    def worker_healthy(self, router, worker):
        return metric(parse_metrics(self.metrics(router)), "tandem_router_worker_healthy",
                      worker=f"{worker.ip}:{worker.ports['grpc']}") == 1

    def chat(self, router, content, max_tokens, key=None):
        """(status, JSON) of a chat over HTTPS to the router, checked for tandem-router."""
        raw = socket.create_connection(("127.0.0.1", self.forwarded[(router.name, "http")]),
                                       timeout=120)
        conn = http.client.HTTPSConnection("127.0.0.1", timeout=120)
        conn.sock = self.context().wrap_socket(raw, server_hostname="tandem-router")
        return post_chat(conn, content, max_tokens,
                         headers={"Authorization": f"Bearer {key}"} if key else None)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("secrets")
    folder.chmod(0o755)
    c = Cluster(folder)
    try:
        yield c
    finally:
        c.pods.close()
        assert not c.pods.net.leftovers()


def test_a_the_routers_follow_every_worker_over_mutual_tls(cluster):
    assert len(cluster.routers) == 2 and len(cluster.prefill) == 1 and len(cluster.decode) == 2
    for router in cluster.routers:
        wait_until(lambda: all(cluster.worker_healthy(router, w) for w in cluster.workers),
                   timeout=60, interval=0.2, what=f"{router.name} to follow every worker")
    for pod in cluster.pods.pods:
        unknown = [line for line in pod.process.log if "matches no flag" in line]
        assert not unknown, (pod.name, unknown)


def test_b_a_chat_needs_a_key_and_is_prefilled_remotely_over_tls(cluster):
    router, prefill = cluster.routers[0], cluster.prefill[0]
    status, body = cluster.chat(router, "Hello", 4)
    assert status == 401 and body["error"]["code"] == "invalid_api_key", body
    placed = metric(parse_metrics(cluster.metrics(router)), "tandem_router_placements_total",
                    prefill="remote")
    status, body = cluster.chat(router, prompt("Which pages were lost in the storm?"), 16, KEY)
    assert status == 200, (body, cluster.pods.logs())
    assert body["choices"][0]["message"]["content"], body
    assert metric(parse_metrics(cluster.metrics(router)), "tandem_router_placements_total",
                  prefill="remote") == placed + 1
    assert metric(parse_metrics(cluster.metrics(prefill)),
                  "tandem_prefill_transfer_bytes_total") > 0
    # TLS gRPC through the other replica, with the key as metadata.
    pb = Protos()
    other = cluster.routers[1]
    with open(cluster.ca, "rb") as f:
        credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
    with grpc.secure_channel(f"127.0.0.1:{cluster.forwarded[(other.name, 'grpc')]}", credentials,
                             options=[("grpc.ssl_target_name_override", "tandem-router")]) as ch:
        stub = pb.inference_grpc.InferenceStub(ch)
        request = greedy_request(pb, prompt("Who kept the books?"), 4)
        with pytest.raises(grpc.RpcError) as error:
            list(stub.Generate(request, timeout=60))
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        responses = list(stub.Generate(request, metadata=[("authorization", f"Bearer {KEY}")],
                                       timeout=120))
    assert sum(len(r.token_ids) for r in responses) == 4
    assert responses[-1].timings.remote_prefill, responses[-1]


def test_c_every_metrics_port_is_https_only(cluster):
    for pod in cluster.pods.pods:
        text = cluster.metrics(pod)
        assert re.search(r"^tandem_", text, re.M), pod.name
        port = pod.ports["http"] if pod.role == "router" else pod.ports["metrics"]
        status, _ = cluster.pods.node.http_get(port, "/metrics", ip=pod.ip)
        assert status == 0, (pod.name, status)  # plain HTTP gets no answer
