"""Planned shutdown of the router (issue 27): on SIGTERM it leaves its Service's rotation (GET
/health 503 "draining", gRPC health NOT_SERVING), refuses new requests (HTTP 503 with Retry-After,
gRPC UNAVAILABLE "router is draining"), lets every request in flight -- streamed over HTTP or
gRPC -- run to its end, and exits 0 once none is left; at its drain timeout it cuts the streams
still open with a clear error instead.

One prefill and one decode worker, as real processes on loopback, serve every test; each test
starts its own router in front of them.
- A long drain timeout: greedy requests (3 streamed over HTTP server-sent events, 1 over gRPC, 1
  whole over HTTP) run while the router drains; each ends with exactly the tokens of an
  undisturbed run, and the router exits 0 as soon as the last one ended, long before the timeout.
- A short drain timeout: requests far longer than the timeout end at the deadline with an error
  event (HTTP stream), a 503 (whole HTTP) or UNAVAILABLE (gRPC) that says why, and the router
  exits 0.
- A second signal during a long drain cuts the streams at once.
Every wait is on an event (a log line, a response, a stream's end), not on time."""
import http.client
import json
import signal
import threading
import time

import grpc
import pytest

from cluster_common import (UCX, WORKER_FLAGS, GenerateStream, OnThread, Process, Protos,
                            greedy_request, grpc_health, http_get, http_request, wait_router_ready,
                            wait_until)

# Tokens of each stream that must finish during the drain: enough that the streams still run
# when the router gets its signal (after their first tokens) and while it refuses new requests,
# few enough to be quick.
FINISH_TOKENS = 256
# Tokens of each stream that must outlive a short drain timeout by far.
CUT_TOKENS = 1500
PROMPTS = ["Count slowly from one to a thousand:", "Tell me about rivers.",
           "The history of the lighthouse keepers of the northern coast is long. Tell it:"]


@pytest.fixture(scope="module")
def pb():
    return Protos()


@pytest.fixture(scope="module")
def workers():
    procs = []
    try:
        procs.append(Process("tandem-prefill", *WORKER_FLAGS, "--worker_id=rdp0", env=UCX))
        procs.append(Process("tandem-decode", *WORKER_FLAGS, "--worker_id=rdd0", env=UCX))
        yield procs
    finally:
        for p in procs:
            p.kill()


class Router:
    """A tandem-router in front of `workers`, with extra flags; kill() on the way out."""

    def __init__(self, workers, *flags):
        addresses = ",".join(w.address for w in workers)
        self.proc = Process("tandem-router", "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0",
                            f"--workers={addresses}", "--local_prefill_threshold=16", *flags)
        try:
            line = next(l for l in self.proc.log if "listening on port " in l)
            self.http_port = int(line.split("(http port ")[1].split(",")[0])
            wait_router_ready(self.proc, len(workers),
                              lambda: http_get(self.http_port, "/health")[0])
        except BaseException:
            self.proc.kill()
            raise
        self.channel = grpc.insecure_channel(self.proc.address)
        self.rc, self.exited, self.signalled = None, None, None
        self._waiter = None

    def stub(self, pb):
        return pb.inference_grpc.InferenceStub(self.channel)

    def signal(self, sig=signal.SIGTERM):
        """Sends `sig`; the first one also starts a thread that notes when the router exits."""
        self.proc.proc.send_signal(sig)
        if self._waiter is None:
            self.signalled = time.monotonic()
            self._waiter = threading.Thread(target=self._wait, daemon=True)
            self._waiter.start()

    def _wait(self):
        self.rc = self.proc.proc.wait()
        self.exited = time.monotonic()

    def await_exit(self, timeout):
        """The exit status; raises when the router is still running after `timeout` s."""
        self._waiter.join(timeout=timeout)
        if self._waiter.is_alive():
            raise AssertionError(f"the router still runs {timeout} s after the signal:\n"
                                 + self.log())
        return self.rc

    def has(self, text):
        return any(text in line for line in self.proc.log)

    def log(self):
        return "".join(self.proc.log[-40:])

    def close(self):
        self.channel.close()
        self.proc.kill()


class SseStream(OnThread):
    """One streamed POST /v1/completions read on a thread: the text of its events, its usage, the
    error event if any, whether "data: [DONE]" came, and when it ended."""

    what = "the HTTP stream"

    def __init__(self, port, prompt, max_tokens):
        self.text, self.usage, self.finish, self.error = "", None, None, None
        self.status, self.done, self.failure = None, False, None
        self._events = 0  # `flowing` after a few text events
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        self.start(port, body)

    def _read(self, port, body):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        try:
            conn.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            self.status = response.status
            for raw in response:
                line = raw.decode().strip()
                if not line:
                    continue
                assert line.startswith("data: "), line
                payload = line[len("data: "):]
                if payload == "[DONE]":
                    self.done = True
                    continue
                event = json.loads(payload)
                if "error" in event:
                    self.error = event["error"]
                    continue
                if event.get("usage"):
                    self.usage = event["usage"]
                for choice in event["choices"]:
                    self.text += choice.get("text", "")
                    self.finish = choice.get("finish_reason") or self.finish
                self._events += 1
                if self._events >= 4:
                    self.flowing.set()
        except Exception as error:  # noqa: BLE001 -- a cut connection is what some tests look for
            self.failure = error
        finally:
            conn.close()


class WholeRequest(OnThread):
    """One POST /v1/completions without streaming, on a thread, with a traceparent of its own so
    that the router's log line of its placement can be awaited: the status and the body."""

    what = "the HTTP request"

    def __init__(self, port, prompt, max_tokens, trace_id):
        self.trace_id = trace_id
        self.status, self.body = None, None
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
        self.start(port, body, headers)

    def _read(self, port, body, headers):
        self.status, self.body = http_request(port, "POST", "/v1/completions", body, headers,
                                              timeout=300)


def grpc_request(pb, max_tokens):
    return greedy_request(pb, "Tell me about mountains.", max_tokens)


def start_streams(router, pb, max_tokens):
    """Every prompt streamed over HTTP, one request over gRPC and one whole over HTTP, at once;
    returns when each stream brought its first tokens and the router placed the whole one."""
    http_streams = [SseStream(router.http_port, p, max_tokens) for p in PROMPTS]
    grpc_stream = GenerateStream(router.stub(pb), grpc_request(pb, max_tokens))
    trace_id = f"{int(time.time() * 1e6):032x}"
    whole = WholeRequest(router.http_port, PROMPTS[0], max_tokens, trace_id)
    for s in [*http_streams, grpc_stream]:
        assert s.flowing.wait(120), "a stream got no tokens"
        assert s.ended_at is None, "a stream ended before the drain"
    wait_until(lambda: any(trace_id in l and "placed on decode worker" in l
                           for l in router.proc.log),
               timeout=120, what="the whole request to be placed")
    assert whole.ended_at is None, "the whole request ended before the drain"
    return http_streams, grpc_stream, whole


def assert_refuses_new_work(router, pb):
    """While the router drains: out of rotation on both health checks, and a new request over
    either API is refused with a retry hint."""
    status, body = http_get(router.http_port, "/health")
    assert status == 503 and body["status"] == "draining", (status, body)
    assert grpc_health(router.proc.address) == 2
    conn = http.client.HTTPConnection("127.0.0.1", router.http_port, timeout=30)
    try:
        conn.request("POST", "/v1/completions",
                     body=json.dumps({"prompt": "Hello", "max_tokens": 4}).encode(),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        refusal = json.loads(response.read())
        assert response.status == 503, refusal
        assert refusal["error"]["message"] == "router is draining", refusal
        assert refusal["error"]["code"] == "UNAVAILABLE", refusal
        assert response.getheader("Retry-After") == "1"
        assert response.getheader("Connection") == "close"
    finally:
        conn.close()
    with pytest.raises(grpc.RpcError) as refused:
        list(router.stub(pb).Generate(grpc_request(pb, 4), timeout=30))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert refused.value.details() == "router is draining"
    assert ("retry-after", "1") in tuple(refused.value.trailing_metadata() or ())


def test_streams_in_flight_finish_and_the_router_exits_when_they_end(pb, workers):
    router = Router(workers, "--drain_timeout_ms=120000")
    try:
        # The reference: the same requests, undisturbed.
        reference_http, reference_grpc, reference_whole = start_streams(router, pb,
                                                                        FINISH_TOKENS)
        reference_grpc.join()
        reference_whole.join()
        for s in reference_http:
            s.join()
            assert s.done and s.error is None and s.usage["completion_tokens"] == FINISH_TOKENS
        assert reference_grpc.error is None and len(reference_grpc.tokens) == FINISH_TOKENS
        assert reference_whole.status == 200, reference_whole.body
        # Whole and streamed, the same prompt gives the same text.
        assert reference_whole.body["choices"][0]["text"] == reference_http[0].text

        http_streams, grpc_stream, whole = start_streams(router, pb, FINISH_TOKENS)
        router.signal()
        wait_until(lambda: router.has("draining: new requests are refused"), timeout=30,
                   what="the router to start draining")
        assert router.has("draining: new requests are refused; 5 in flight may finish"), \
            router.log()
        assert_refuses_new_work(router, pb)
        # The refusals came while requests ran.
        assert any(s.ended_at is None for s in [*http_streams, grpc_stream, whole])

        for s, want in zip(http_streams, reference_http):
            s.join()
            assert s.status == 200 and s.failure is None and s.error is None, (s.failure, s.error)
            assert s.done and s.finish == "length"
            assert s.usage["completion_tokens"] == FINISH_TOKENS
            assert s.text == want.text
        grpc_stream.join(ok=True)
        assert grpc_stream.tokens == reference_grpc.tokens
        assert grpc_stream.last.finish_reason == pb.inference.FINISH_REASON_LENGTH
        whole.join()
        assert whole.status == 200, whole.body
        assert whole.body["choices"][0]["text"] == reference_http[0].text
        assert whole.body["usage"]["completion_tokens"] == FINISH_TOKENS

        assert router.await_exit(timeout=60) == 0, router.log()
        last_end = max(s.ended_at for s in [*http_streams, grpc_stream, whole])
        print(f"router exited {router.exited - router.signalled:.2f} s after SIGTERM, "
              f"{router.exited - last_end:.2f} s after the last stream ended (drain timeout 120 s)")
        assert router.has("every drainable was idle"), router.log()
        assert not router.has("cutting"), router.log()
        # It left once the streams were done, not at its timeout.
        assert router.exited - last_end < 10
        # The decode worker still serves (the router's end cost it nothing).
        assert workers[1].proc.poll() is None
    finally:
        router.close()


def assert_cut(http_streams, grpc_stream, whole):
    """Each request ended with an error that says the drain cut it: an error event and [DONE] on
    an HTTP stream, 503 for a whole HTTP request, UNAVAILABLE on gRPC."""
    for s in http_streams:
        s.join()
        assert s.status == 200 and s.failure is None, s.failure
        assert s.error is not None and s.done, (s.error, s.done)
        assert s.error["code"] == "UNAVAILABLE", s.error
        assert "router is draining" in s.error["message"], s.error
        assert s.text and s.finish is None  # it had streamed, and did not end normally
    grpc_stream.join()
    assert grpc_stream.error is not None and grpc_stream.last is None
    assert grpc_stream.error.code() == grpc.StatusCode.UNAVAILABLE
    assert "router is draining" in grpc_stream.error.details(), grpc_stream.error.details()
    whole.join()
    assert whole.status == 503, whole.body
    assert whole.body["error"]["code"] == "UNAVAILABLE", whole.body
    assert "router is draining" in whole.body["error"]["message"], whole.body


def test_streams_open_at_the_drain_deadline_end_with_an_error(pb, workers):
    drain_ms = 1500
    router = Router(workers, f"--drain_timeout_ms={drain_ms}")
    try:
        http_streams, grpc_stream, whole = start_streams(router, pb, CUT_TOKENS)
        router.signal()
        assert_cut(http_streams, grpc_stream, whole)
        for s in http_streams:
            assert "cut as the drain ended" in s.error["message"], s.error
        assert "cut as the drain ended" in grpc_stream.error.details()
        assert "cut as the drain ended" in whole.body["error"]["message"]
        assert router.await_exit(timeout=60) == 0, router.log()
        seconds = router.exited - router.signalled
        print(f"router exited {seconds:.2f} s after SIGTERM (drain timeout {drain_ms / 1000} s)")
        assert router.has("the drain timeout passed"), router.log()
        assert router.has("cutting 5 requests still in flight"), router.log()
        assert drain_ms / 1000 <= seconds < drain_ms / 1000 + 15
        # Every request ended at the deadline, before the process did.
        assert all(s.ended_at <= router.exited for s in [*http_streams, grpc_stream, whole])
        assert workers[1].proc.poll() is None
    finally:
        router.close()


def test_a_second_signal_cuts_the_streams_at_once(pb, workers):
    router = Router(workers, "--drain_timeout_ms=120000")
    try:
        http_streams, grpc_stream, whole = start_streams(router, pb, CUT_TOKENS)
        router.signal()
        wait_until(lambda: router.has("draining: new requests are refused"), timeout=30,
                   what="the router to start draining")
        router.signal(signal.SIGINT)  # an impatient operator: Ctrl-C
        assert_cut(http_streams, grpc_stream, whole)
        assert router.await_exit(timeout=60) == 0, router.log()
        print(f"router exited {router.exited - router.signalled:.2f} s after the first signal "
              "(drain timeout 120 s)")
        assert router.has("a second signal came"), router.log()
        assert router.has("cutting 5 requests still in flight"), router.log()
    finally:
        router.close()
