"""Planned shutdown (issue 27): a worker that gets SIGTERM under load leaves the router's
placement at once, finishes or hands off what it holds within its drain timeout, and exits 0; no
request is lost.

A router (round_robin, so both decode workers hold streams) in front of 1 prefill + 2 decode
workers, as real processes on loopback.
- Short drain timeout: SIGTERM one decode worker early in its streams. Its health says NOT_SERVING,
  the router hears it drains (its gauge) before the drain ends and places a new request on the
  other worker only, and at the deadline the worker hands its streams off; the router moves each
  one with the tokens so far (migrations{reason="worker_draining"}) and the clients see exactly the
  tokens of an undisturbed run of the same requests. The worker exits 0 soon after the deadline.
- Long drain timeout: the streams finish on the draining worker itself (no migration), and it
  exits as soon as they end, long before the timeout.
- A second signal (SIGINT) during a long drain hands the streams off at once.
- A prefill worker SIGTERMed under a stream of long prompts: the prompts in flight finish, later
  ones are prefilled by the decode workers, nothing fails (the same tokens as when asked again),
  and it exits 0 at once.
Every wait is on an event (a log line, a metric, a stream's end), not on time."""
import signal
import threading
import time

import grpc
import pytest

from cluster_common import (UCX, WORKER_FLAGS, GenerateStream, Process, Protos, greedy_request,
                            grpc_health, http_get, wait_router_ready, wait_until)

# Tokens of each stream of the short-drain test: far more than the drain timeout lets a worker
# generate, so that the streams on the draining worker are still running at its deadline.
MAX_TOKENS = 480


@pytest.fixture(scope="module")
def pb():
    return Protos()


class DrainCluster:
    """1 prefill + 2 decode workers and a round_robin router; `drain_ms` maps a worker name
    (p0, d0, d1) to its --drain_timeout_ms."""

    def __init__(self, tag, drain_ms):
        self.procs = {}
        self.router = None
        try:
            for name, binary in (("p0", "tandem-prefill"), ("d0", "tandem-decode"),
                                 ("d1", "tandem-decode")):
                flags = [*WORKER_FLAGS, f"--worker_id={tag}{name}"]
                if name in drain_ms:
                    flags.append(f"--drain_timeout_ms={drain_ms[name]}")
                self.procs[name] = Process(binary, *flags, env=UCX)
            addresses = ",".join(p.address for p in self.procs.values())
            self.router = Process("tandem-router", "--listen=127.0.0.1:0",
                                  "--http_listen=127.0.0.1:0", f"--workers={addresses}",
                                  "--policy=round_robin", "--local_prefill_threshold=16")
            line = next(l for l in self.router.log if "listening on port " in l)
            self.http_port = int(line.split("(http port ")[1].split(",")[0])
            wait_router_ready(self.router, 3, lambda: http_get(self.http_port, "/health")[0])
        except BaseException:
            self.stop()
            raise
        self.stub = None

    def inference(self, pb):
        if self.stub is None:
            channel = grpc.insecure_channel(self.router.address)
            self.stub = pb.inference_grpc.InferenceStub(channel)
        return self.stub

    def metric(self, name, **labels):
        """The value of one series on the router's /metrics (0 when absent)."""
        status, text = http_get(self.http_port, "/metrics")
        assert status == 200, text
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            if not line.startswith(name + "{") and line.split(" ")[0] != name:
                continue
            series, value = line.rsplit(" ", 1)
            got = series[len(name):].strip("{}")
            if ",".join(sorted(got.split(","))) == want:
                return float(value)
        return 0.0

    def stop(self):
        for p in ([self.router] if self.router else []) + list(self.procs.values()):
            p.kill()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.stop()


def decode_requests(pb, max_tokens):
    """Greedy requests with short prompts (prefilled by the decode worker) and long ones (by the
    prefill worker), all of max_tokens tokens."""
    long_prompt = ("The history of the lighthouse keepers of the northern coast is long and "
                   "full of storms, shipwrecks and quiet heroism. ") * 3
    prompts = ["Count slowly from one to a thousand:", "Tell me about rivers.",
               long_prompt + "Tell the story of one of them.",
               long_prompt + "List the dangers they faced."]
    return [greedy_request(pb, p, max_tokens) for p in prompts]


def run_all(stub, requests):
    """Every request at once, to its end (each must succeed)."""
    return [s.join(ok=True) for s in [GenerateStream(stub, r) for r in requests]]


def sigterm_under_load(cluster, pb, max_tokens, flowing_after=4):
    """The decode_requests of `max_tokens` streamed at once; once each brought `flowing_after`
    tokens, SIGTERM to decode worker d0. (d0, the streams, its Terminated.)"""
    streams = [GenerateStream(cluster.inference(pb), r, flowing_after)
               for r in decode_requests(pb, max_tokens)]
    for s in streams:
        assert s.flowing.wait(120), "a stream got no tokens"
    victim = cluster.procs["d0"]
    return victim, streams, Terminated(victim)


class Terminated:
    """SIGTERM to a process, and a thread that notes when it exits."""

    def __init__(self, process):
        self.proc = process.proc
        self.rc, self.exited = None, None
        self.sent = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self):
        self.rc = self.proc.wait()
        self.exited = time.monotonic()

    def await_exit(self, timeout):
        """(exit status, seconds from SIGTERM to the exit)."""
        self.thread.join(timeout=timeout)
        if self.thread.is_alive():
            raise AssertionError(f"still running {timeout} s after SIGTERM")
        return self.rc, self.exited - self.sent


def log_has(process, text):
    return any(text in line for line in process.log)


def test_short_drain_hands_the_streams_off_and_loses_no_token(pb):
    drain_ms = 2000
    with DrainCluster("short", {"d0": drain_ms}) as cluster:
        stub = cluster.inference(pb)
        other = cluster.procs["d1"]
        # Long enough that the streams on the victim outlive its drain timeout by far.
        work = decode_requests(pb, max_tokens=MAX_TOKENS)
        reference = [s.tokens for s in run_all(stub, work)]
        assert all(len(t) == MAX_TOKENS for t in reference)

        victim, streams, term = sigterm_under_load(cluster, pb, MAX_TOKENS, flowing_after=8)
        # The worker fails its readiness, and the router hears of the drain from the worker's
        # state stream before its deadline (its streams still run).
        wait_until(lambda: grpc_health(victim.address) == 2, timeout=30, interval=0.02,
                   what="the health service to say NOT_SERVING")
        wait_until(lambda: cluster.metric("tandem_router_worker_draining",
                                          worker=victim.address) == 1,
                   timeout=30, interval=0.02, what="the router to see the drain")
        assert term.exited is None and not log_has(victim, "drain ended")
        assert cluster.metric("tandem_router_worker_healthy", worker=victim.address) == 1
        # A request after that goes to the other worker only, without a detour.
        after = GenerateStream(stub, work[0]).join(ok=True)
        assert after.tokens == reference[0]
        assert after.last.timings.decode_worker == "shortd1", after.last.timings
        assert after.last.timings.migrations == 0

        rc, seconds = term.await_exit(timeout=drain_ms / 1000 + 30)
        assert rc == 0, "".join(victim.log[-30:])
        print(f"victim exited {seconds:.2f} s after SIGTERM (drain timeout {drain_ms / 1000} s)")
        assert drain_ms / 1000 <= seconds < drain_ms / 1000 + 10
        assert log_has(victim, "the drain timeout passed"), "".join(victim.log[-30:])
        assert log_has(victim, "streams still in progress"), "".join(victim.log[-30:])

        moved = 0
        for s, want in zip(streams, reference):
            s.join(ok=True)
            assert s.tokens == want
            assert s.last.finish_reason == pb.inference.FINISH_REASON_LENGTH
            assert s.last.usage.completion_tokens == MAX_TOKENS
            moved += s.last.timings.migrations
            if s.last.timings.migrations:
                assert s.last.timings.decode_worker == "shortd1", s.last.timings
        # Round robin put half of the streams on the victim, each still running at its deadline.
        assert moved >= 1, moved
        assert cluster.metric("tandem_router_migrations_total", reason="worker_draining") == moved
        assert cluster.metric("tandem_router_migrations_total", reason="worker_failed") == 0
        # The victim's state stream ended as a departure, not a loss.
        wait_until(lambda: log_has(cluster.router, "left (drained)"), timeout=30,
                   what="the router to see the worker leave")
        assert not log_has(cluster.router, f"worker {victim.address} lost")
        assert cluster.metric("tandem_router_worker_draining", worker=victim.address) == 1
        assert other.proc.poll() is None


def test_long_drain_lets_the_streams_finish_where_they_are(pb):
    drain_ms = 120000
    with DrainCluster("long", {"d0": drain_ms}) as cluster:
        victim, streams, term = sigterm_under_load(cluster, pb, max_tokens=192)
        wait_until(lambda: cluster.metric("tandem_router_worker_draining",
                                          worker=victim.address) == 1,
                   timeout=30, interval=0.02, what="the router to see the drain")

        rc, seconds = term.await_exit(timeout=drain_ms / 1000)
        assert rc == 0, "".join(victim.log[-30:])
        for s in streams:
            s.join(ok=True)
            assert len(s.tokens) == 192
            assert s.last.finish_reason == pb.inference.FINISH_REASON_LENGTH
            assert s.last.timings.migrations == 0, s.last.timings
        on_victim = [s for s in streams if s.last.timings.decode_worker == "longd0"]
        assert on_victim, "round robin put no stream on the victim"
        last_end = max(s.ended_at for s in on_victim)
        print(f"victim exited {seconds:.2f} s after SIGTERM, {term.exited - last_end:.2f} s "
              f"after its last stream ended (drain timeout {drain_ms / 1000} s)")
        # It left once its streams were done, not at the timeout.
        assert log_has(victim, "every drainable was idle"), "".join(victim.log[-30:])
        assert not log_has(victim, "streams still in progress")
        assert seconds < drain_ms / 1000 / 2
        assert cluster.metric("tandem_router_migrations_total", reason="worker_draining") == 0


def test_a_second_signal_hands_off_at_once(pb):
    drain_ms = 120000
    with DrainCluster("again", {"d0": drain_ms}) as cluster:
        victim, streams, term = sigterm_under_load(cluster, pb, max_tokens=MAX_TOKENS)
        wait_until(lambda: log_has(victim, "in progress may finish"), timeout=30,
                   what="the drain to start")
        victim.proc.send_signal(signal.SIGINT)  # an impatient operator: Ctrl-C
        rc, seconds = term.await_exit(timeout=60)
        assert rc == 0, "".join(victim.log[-30:])
        print(f"victim exited {seconds:.2f} s after the first signal (drain timeout "
              f"{drain_ms / 1000} s)")
        assert log_has(victim, "a second signal came"), "".join(victim.log[-30:])
        moved = 0
        for s in streams:
            s.join(ok=True)
            assert len(s.tokens) == MAX_TOKENS
            assert s.last.finish_reason == pb.inference.FINISH_REASON_LENGTH
            moved += s.last.timings.migrations
        assert moved >= 1
        assert cluster.metric("tandem_router_migrations_total", reason="worker_draining") == moved


def test_a_draining_prefill_worker_loses_no_prompt(pb):
    with DrainCluster("pre", {"p0": 60000}) as cluster:  # far beyond what its prompts need
        stub = cluster.inference(pb)
        victim = cluster.procs["p0"]
        story = ("The history of the lighthouse keepers of the northern coast is long and full of "
                 "storms, shipwrecks and quiet heroism. ") * 3

        def request(i):
            # A distinct start each time: no decode worker has the prompt cached, so every one is
            # long enough to be prefilled remotely while the prefill worker takes work.
            return greedy_request(pb, f"Keeper {i}. " + story + "Go on.", 8)

        done, lock, stop = [], threading.Lock(), threading.Event()

        def client(first):
            i = first
            while not stop.is_set():
                s = GenerateStream(stub, request(i))
                s.thread.join(timeout=300)
                with lock:
                    done.append((i, s))
                i += 2

        clients = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(2)]
        for c in clients:
            c.start()
        wait_until(lambda: sum(s.last is not None and s.last.timings.remote_prefill
                               for _, s in list(done)) >= 2, timeout=120,
                   what="remote prefills before the drain")
        term = Terminated(victim)
        rc, seconds = term.await_exit(timeout=60)
        assert rc == 0, "".join(victim.log[-30:])
        print(f"prefill worker exited {seconds:.2f} s after SIGTERM")
        assert log_has(victim, "every drainable was idle"), "".join(victim.log[-30:])
        with lock:
            count = len(done)
        wait_until(lambda: len(done) >= count + 2, timeout=120,
                   what="requests after the prefill worker left")
        stop.set()
        for c in clients:
            c.join(timeout=300)
        assert done
        for i, s in done:
            assert s.error is None, (i, s.error.code(), s.error.details())
            assert len(s.tokens) == 8 and s.last.finish_reason == pb.inference.FINISH_REASON_LENGTH
        # The ones sent after it left were prefilled by the decode workers.
        later = [s for _, s in done if s.started_at > term.exited]
        assert later and not any(s.last.timings.remote_prefill for s in later)
        # The same tokens as an undisturbed run (by the decode workers, on a cluster whose
        # prefill worker is gone; the prompts are prefilled there from scratch or from cache).
        for i, s in done[::4]:
            again = GenerateStream(stub, request(i)).join(ok=True)
            assert again.tokens == s.tokens, i
