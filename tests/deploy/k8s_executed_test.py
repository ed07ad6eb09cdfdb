"""The Kubernetes manifests executed: the cpu overlay rendered (`kubectl kustomize`), and each
workload's container command, args and environment started as they are, one network namespace
per pod, replicas included (k8s_pods.py: two routers, one prefill and two decode workers), with
the Services' DNS names resolving to those pods' addresses and each pod's probes run against it.

  -  Each process is its binary with exactly the manifest's environment (less what the
     entrypoint removes), as uid/gid 10001 without privileges, and no TANDEM_* variable it gets
     is unknown to it.
  a. The cluster they form serves a chat through the router Service, with remote prefill: the
     router counts a remote placement, the prefill pod's KV reaches a decode pod over UCX/TCP
     (its transfer bytes grow), and a gRPC call's timings name the pods (their worker ids come
     from the downward API).
  b. A decode pod SIGKILLed while it streams (two decode pods): every stream completes with the
     tokens it gets undisturbed (the router moves the dead pod's streams to the other), and a
     new request through each router replica still succeeds.

Mapped to this machine, and nothing else (k8s_pods.py says how): the image's entrypoint is
deploy/docker/entrypoint.sh, its binaries build/release/bin (TANDEM_BIN_DIR, the image
contract's seam), the model volume /models the repository's models/ (what the init container
would fetch), and the sizes in SMALL_MACHINE. Waits are on probes, metrics and streams."""
import http.client
import json
import os
import pathlib
import re
import time

import grpc
import pytest

import k8s_pods
import k8s_render as k8s

k8s_pods.require_pods()

from cluster_common import (BIN, GenerateStream, Protos, WorkerPools,  # noqa: E402
                            greedy_request, wait_until)

NAMESPACE = "tandem"
ENTRYPOINT = k8s.ROOT / "deploy" / "docker" / "entrypoint.sh"
# The manifests' values that would not fit two cores and a few GiB, replaced by name (each must
# be in the manifests): the KV pool (1 GiB per worker) and the kernel threads (4 per worker).
SMALL_MACHINE = {"TANDEM_KV_CACHE_MB": "64", "TANDEM_THREADS": "1"}

# Prompts of well over TANDEM_LOCAL_PREFILL_THRESHOLD (256) tokens: the router sends them to a
# prefill worker. Each request begins with words of its own, so that no cached prefix makes it
# short.
STORY = (
    "The harbour town kept its records in a long stone building by the water. Every ship that "
    "came in was written down: its name, its captain, what it carried, and the weather on the "
    "day it arrived. Over two hundred years the books filled three rooms. The clerks who kept "
    "them knew the tides by heart, and could tell from the handwriting which of their "
    "predecessors had been tired, or cold, or in love. In the winter of the great storm the sea "
    "came into the lower room and the oldest books were carried up the stairs by lantern light, "
    "one armful at a time, while the wind tore slates from the roof. Some pages were lost and "
    "others were dried by the fire in the weeks after, their ink run into pale blue clouds. "
    "The town still argues about what those pages said: which ships came in that year, who "
    "married whom, and whether the lighthouse keeper's daughter really sailed away on the brig "
    "from the south with a sailor nobody knew. Children are told that the missing pages hold "
    "the answer, and that one day the sea will give them back. The clerks of today keep the "
    "books on a higher floor, and when the wind rises at night they still climb the stairs to "
    "look at the water, just in case. ")


def prompt(opening):
    return f"{opening} {STORY * 2}"


def parse_metrics(text):
    """{(name, frozenset(labels)): value} of a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        match = re.fullmatch(r"([^{\s#]+)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?", line)
        if match:
            labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
            out[(match.group(1), labels)] = float(match.group(3))
    return out


def metric(samples, name, **labels):
    """The sum of `name`'s samples that carry `labels`; 0 when there is none."""
    want = {(k, str(v)) for k, v in labels.items()}
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def post_chat(conn, content, max_tokens, headers=None):
    """(status, JSON) of a greedy chat completion sent over `conn`, which is closed after."""
    try:
        conn.request("POST", "/v1/chat/completions",
                     headers={"Content-Type": "application/json", **(headers or {})},
                     body=json.dumps({"messages": [{"role": "user", "content": content}],
                                      "max_tokens": max_tokens, "temperature": 0}))
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


class Cluster(WorkerPools):
    """The pods, and ways in: the router Service's pods reached from the "node" namespace."""

    def __init__(self):
        objects = k8s.render("overlays/cpu")
        assert ENTRYPOINT.is_file(), f"{ENTRYPOINT} is missing (the images' entrypoint)"
        self.pods = k8s_pods.PodCluster(
            objects, NAMESPACE,
            image_paths={k8s.ENTRYPOINT: ENTRYPOINT},
            mounts={"/models": k8s.ROOT / "models"},
            extra_env={"TANDEM_BIN_DIR": str(BIN)},
            overrides=SMALL_MACHINE)
        started = time.monotonic()
        # The probes' own budgets (the workers' startup probe allows 10 minutes) capped, so that
        # a pod that never starts fails the test with its log before CTest's timeout.
        self.pods.start(limit_s=150)
        try:
            self.routers = self.pods.endpoints("tandem-router")
            self.prefill = self.pods.of_role("prefill")
            self.decode = self.pods.of_role("decode")
            assert len(self.routers) == 2 and len(self.prefill) == 1 and len(self.decode) == 2, \
                self.pods.pods
            # Every router follows every worker (found through the headless Services' names).
            for router in self.routers:
                wait_until(lambda: all(self.worker_healthy(router, w) for w in self.workers),
                           timeout=60, interval=0.2,
                           what=f"{router.name} to follow every worker")
            print(f"{len(self.pods.pods)} pods ready {time.monotonic() - started:.1f} s after "
                  f"the start: {self.pods.pods}")
            self.http_ports = {r.name: self.pods.node.forward(r.ports["http"], ip=r.ip)
                               for r in self.routers}
            self.channels = {r.name: grpc.insecure_channel(
                f"127.0.0.1:{self.pods.node.forward(r.ports['grpc'], ip=r.ip)}")
                for r in self.routers}
        except BaseException:
            self.close()
            raise

    def close(self):
        for channel in getattr(self, "channels", {}).values():
            channel.close()
        self.pods.close()

    def metrics(self, pod):
        port = pod.ports["http"] if pod.role == "router" else pod.ports["metrics"]
        status, text = self.pods.node.http_get(port, "/metrics", ip=pod.ip)
        assert status == 200, (pod.name, status, text)
        return parse_metrics(text)

    def worker_healthy(self, router, worker):
        return metric(self.metrics(router), "tandem_router_worker_healthy",
                      worker=f"{worker.ip}:{worker.ports['grpc']}") == 1

    def chat(self, router, content, max_tokens):
        return post_chat(
            http.client.HTTPConnection("127.0.0.1", self.http_ports[router.name], timeout=120),
            content, max_tokens)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    try:
        yield c
    finally:
        c.close()
        assert not c.pods.net.leftovers()


@pytest.fixture(scope="module")
def pb():
    return Protos()


def stream(pb, cluster, router, text, max_tokens):
    """A greedy gRPC Generate call through a router, read on a thread."""
    return GenerateStream(pb.inference_grpc.InferenceStub(cluster.channels[router.name]),
                          greedy_request(pb, text, max_tokens), flowing_after=2)


def generate(pb, cluster, router, text, max_tokens):
    s = stream(pb, cluster, router, text, max_tokens).join()
    assert s.error is None, (s.describe(), cluster.pods.logs())
    assert len(s.tokens) == max_tokens, s.describe()
    return s


def test_the_processes_run_as_the_manifests_say(cluster):
    """Each pod's process is its binary, with the manifest's environment (less what the
    entrypoint removes), as uid/gid 10001 without privileges; and no TANDEM_* variable of the
    manifests is unknown to the binary that got it (it would warn)."""
    for pod in cluster.pods.pods:
        pid = pod.process.proc.pid
        binary = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        assert binary == k8s.BINARY_OF_ROLE[pod.role], (pod.name, binary)
        environ = dict(entry.split("=", 1) for entry in
                       pathlib.Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
                       if "=" in entry)
        expected = {k: v for k, v in pod.env.items() if k not in ("TANDEM_BIN_DIR", "TANDEM_ROLE")}
        assert {k: environ.get(k) for k in expected} == expected, pod.name
        assert set(environ) - set(expected) <= {"PWD", "SHLVL", "OLDPWD", "_"}, \
            (pod.name, sorted(set(environ) - set(expected)))
        status = dict(line.split(":", 1) for line in
                      pathlib.Path(f"/proc/{pid}/status").read_text().splitlines())
        assert status["Uid"].split() == ["10001"] * 4 and status["Gid"].split() == ["10001"] * 4
        assert status["NoNewPrivs"].strip() == "1" and int(status["CapBnd"], 16) == 0, status
        unknown = [line for line in pod.process.log if "matches no flag" in line]
        assert not unknown, (pod.name, unknown)
    router = cluster.routers[0]
    assert router.env["TANDEM_WORKERS_DNS"] == ",".join(
        f"tandem-{pool}.{NAMESPACE}.svc.cluster.local:7100" for pool in ("prefill", "decode"))


def test_a_chat_with_remote_prefill_through_the_router_service(cluster, pb):
    router, prefill = cluster.routers[0], cluster.prefill[0]
    placed = metric(cluster.metrics(router), "tandem_router_placements_total", prefill="remote")
    moved = metric(cluster.metrics(prefill), "tandem_prefill_transfer_bytes_total")
    status, body = cluster.chat(router, prompt("Which pages were lost in the storm?"), 24)
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"], body
    assert body["usage"]["prompt_tokens"] > 256, body["usage"]
    print(f"chat: {body['usage']}, {choice['finish_reason']}: {choice['message']['content']!r}")
    # The router placed it on the prefill pod, whose KV went to a decode pod over UCX/TCP.
    assert metric(cluster.metrics(router), "tandem_router_placements_total",
                  prefill="remote") == placed + 1
    transferred = metric(cluster.metrics(prefill), "tandem_prefill_transfer_bytes_total") - moved
    assert transferred > 0
    # Through the other router replica, over gRPC: the timings name the pods (the worker ids are
    # the pods' names, from the downward API).
    s = generate(pb, cluster, cluster.routers[1], prompt("Who kept the books?"), 8)
    timings = s.last.timings
    assert timings.remote_prefill and timings.prefill_worker == prefill.name, s.describe()
    assert timings.decode_worker in {d.name for d in cluster.decode}, s.describe()
    print(f"gRPC through {cluster.routers[1].name}: {transferred:.0f} KV bytes moved before; "
          f"prefill {timings.prefill_worker}, decode {timings.decode_worker}, "
          f"kv_transfer {timings.kv_transfer_us} us")


def test_b_a_decode_pod_killed_mid_stream_is_survived(cluster, pb):
    router = cluster.routers[0]
    max_tokens = 160
    prompts = ["Count slowly from one to a hundred:", "Describe a walk by the sea.",
               "Tell me about old libraries.", prompt("What did the clerks see at night?")]
    reference = [generate(pb, cluster, router, p, max_tokens).tokens for p in prompts]
    migrations = metric(cluster.metrics(router), "tandem_router_migrations_total")
    streams = [stream(pb, cluster, router, p, max_tokens) for p in prompts]
    for s in streams:
        assert s.flowing.wait(120), f"a stream got no tokens: {s.describe()}"
    load = {d.name: metric(cluster.metrics(d), "tandem_worker_running_sequences")
            for d in cluster.decode}
    victim = max(cluster.decode, key=lambda d: load[d.name])
    survivor = next(d for d in cluster.decode if d is not victim)
    assert load[victim.name] >= 1, load
    victim.kill()
    print(f"SIGKILL {victim.name} ({victim.ip}) holding {load}")
    for i, s in enumerate(streams):
        s.join()
        assert s.error is None, (i, s.describe(), cluster.pods.logs())
        assert s.tokens == reference[i], (i, s.describe())
        assert s.last.timings.decode_worker == survivor.name, (i, s.describe())
    moved = sum(s.last.timings.migrations for s in streams)
    assert moved >= 1, [s.describe() for s in streams]
    assert metric(cluster.metrics(router), "tandem_router_migrations_total") - migrations == moved
    assert not victim.alive()
    print(f"{moved} streams moved to {survivor.name}; all completed")
    # Both router replicas still serve, on the surviving decode pod.
    for r in cluster.routers:
        status, body = cluster.chat(r, f"Say hello from {r.name}.", 8)
        assert status == 200 and body["choices"][0]["message"]["content"], (r.name, body)
        after = generate(pb, cluster, r, "Name three birds.", 8)
        assert after.last.timings.decode_worker == survivor.name, after.describe()
