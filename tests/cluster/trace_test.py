"""Request tracing across the pools (docs/tracing.md): a W3C traceparent sent to the router, over
HTTP (whole and streamed) or gRPC, comes back with the router's span id and the same trace id, and
that trace id tags the request's log lines in the router, the decode worker and the prefill worker
that computed its prompt; each process's first line names its parent span, so the path can be
followed from process to process. A request without a traceparent gets a new trace; a malformed
one is replaced, not echoed.

One router in front of one prefill and one decode worker; every prompt is new and longer than the
router's local_prefill_threshold (16), so it is prefilled on the prefill worker."""
import http.client
import json
import re
import secrets

import grpc
import pytest

from cluster_common import Cluster, Protos, wait_until

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
TAG = re.compile(r"trace_id=([0-9a-f]{32}) span_id=([0-9a-f]{16}) ")
PARENT = re.compile(r"\(parent span ([0-9a-f]{16})\)")


def new_traceparent():
    """A client's traceparent: random trace and parent ids, sampled."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def prompt(seed):
    """A prompt no earlier request shares a block with: about 60 tokens."""
    words = ["harbour", "violin", "lantern", "orchard", "glacier", "compass", "meadow", "anvil"]
    return " ".join(f"{words[(seed * 7 + i * 3) % 8]}-{seed}-{i}" for i in range(20))


def post(port, path, body, headers=None):
    """(status, response headers as a dict with lowercase keys, body text) of a POST."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body=json.dumps(body) if isinstance(body, dict) else body,
                     headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        text = response.read().decode("utf-8", "replace")
        return response.status, {k.lower(): v for k, v in response.getheaders()}, text
    finally:
        conn.close()


def parse_traceparent(value):
    match = TRACEPARENT.match(value or "")
    assert match, f"not a version 00 traceparent: {value!r}"
    trace_id, span_id, flags = match.groups()
    assert trace_id != "0" * 32 and span_id != "0" * 16, value
    return trace_id, span_id, flags


def lines_of(process, trace_id):
    """The lines of `process`'s log tagged with `trace_id`, as (span id, line)."""
    out = []
    for line in list(process.log):
        match = TAG.search(line)
        if match and match.group(1) == trace_id:
            out.append((match.group(2), line))
    return out


def wait_for_line(process, trace_id, text, what):
    """Waits until `process` logged a line tagged with `trace_id` that contains `text`; returns
    (span id, line)."""
    def found():
        return next(((s, l) for s, l in lines_of(process, trace_id) if text in l), None)
    try:
        return wait_until(found, timeout=60, what=what)
    except AssertionError as error:
        raise AssertionError(f"{error}; its log ends with:\n{''.join(process.log[-30:])}") from None


@pytest.fixture(scope="module")
def pb():
    return Protos()


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(prefill=1, decode=1, policy="kv_aware", tag="t")
    yield c
    c.stop()


def follow(cluster, trace_id, router_span):
    """Follows one remotely prefilled request through the three logs, and checks that each hop's
    parent is the previous one's span: client -> router -> decode worker -> prefill worker."""
    router, decode, prefill = cluster.router, cluster.decode[0], cluster.prefill[0]
    span, placed = wait_for_line(router, trace_id, ": placed on decode worker td0",
                                 "the router's placement line")
    assert span == router_span, placed
    assert "prefill on tp0" in placed, placed
    span, finished = wait_for_line(router, trace_id, ": ok;", "the router's end line")
    assert span == router_span and "prefill on tp0 (remote)" in finished, finished

    decode_span, started = wait_for_line(decode, trace_id, ": started;",
                                         "the decode worker's start line")
    assert PARENT.search(started).group(1) == router_span, started
    assert decode_span != router_span, started
    _, ended = wait_for_line(decode, trace_id, ": finished;", "the decode worker's end line")
    assert "prefill on tp0" in ended, ended

    prefill_span, prefilled = wait_for_line(prefill, trace_id, ": prefilled ",
                                            "the prefill worker's line")
    assert PARENT.search(prefilled).group(1) == decode_span, prefilled
    assert "KV writes to td0 done" in prefilled, prefilled
    assert prefill_span not in (router_span, decode_span), prefilled
    # Every line about the request in each process carries its own span.
    for process, own in ((router, router_span), (decode, decode_span), (prefill, prefill_span)):
        assert {s for s, _ in lines_of(process, trace_id)} == {own}, lines_of(process, trace_id)


def test_an_http_chat_keeps_the_clients_trace_through_every_process(cluster):
    sent = new_traceparent()
    trace_id, client_span, _ = parse_traceparent(sent)
    status, headers, text = post(
        cluster.http_port, "/v1/chat/completions",
        {"messages": [{"role": "user", "content": prompt(1)}], "max_tokens": 4,
         "temperature": 0},
        {"traceparent": sent, "tracestate": "tandem-test=1"})
    assert status == 200, text
    back = parse_traceparent(headers.get("traceparent"))
    assert back[0] == trace_id and back[2] == "01", (sent, back)
    assert back[1] != client_span, "the router answers with its own span id"
    _, placed = wait_for_line(cluster.router, trace_id, ": placed", "the router's placement")
    assert PARENT.search(placed).group(1) == client_span, placed
    follow(cluster, trace_id, back[1])


def test_a_streamed_completion_carries_the_trace_in_its_headers(cluster):
    sent = new_traceparent()
    trace_id, client_span, _ = parse_traceparent(sent)
    status, headers, text = post(
        cluster.http_port, "/v1/completions",
        {"prompt": prompt(2), "max_tokens": 4, "temperature": 0, "ignore_eos": True,
         "stream": True}, {"traceparent": sent})
    assert status == 200, text
    assert headers.get("content-type") == "text/event-stream", headers
    assert text.rstrip().endswith("data: [DONE]"), text[-200:]
    back = parse_traceparent(headers.get("traceparent"))
    assert back[0] == trace_id and back[1] != client_span, (sent, back)
    follow(cluster, trace_id, back[1])


def test_a_grpc_generate_reads_and_answers_traceparent_metadata(pb, cluster):
    sent = new_traceparent()
    trace_id, client_span, _ = parse_traceparent(sent)
    stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))
    call = stub.Generate(
        pb.inference.GenerateRequest(
            prompt=prompt(3),
            sampling=pb.inference.SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)),
        metadata=[("traceparent", sent)], timeout=120)
    initial = dict(call.initial_metadata())
    responses = list(call)
    assert responses[-1].timings.remote_prefill, responses[-1].timings
    back = parse_traceparent(initial.get("traceparent"))
    assert back[0] == trace_id and back[1] != client_span, (sent, back)
    follow(cluster, trace_id, back[1])


def test_a_request_without_traceparent_starts_a_new_trace(cluster):
    status, headers, text = post(
        cluster.http_port, "/v1/completions",
        {"prompt": prompt(4), "max_tokens": 2, "temperature": 0, "ignore_eos": True})
    assert status == 200, text
    trace_id, router_span, flags = parse_traceparent(headers.get("traceparent"))
    assert flags == "01", headers
    follow(cluster, trace_id, router_span)
    _, placed = wait_for_line(cluster.router, trace_id, ": placed", "the router's placement")
    assert not PARENT.search(placed), placed  # the router's span is the trace's first


@pytest.mark.parametrize("bad", [
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",  # uppercase
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",  # a field too many
])
def test_a_malformed_traceparent_is_replaced_not_echoed(cluster, bad):
    status, headers, text = post(
        cluster.http_port, "/v1/completions",
        {"prompt": "Hi", "max_tokens": 1, "temperature": 0}, {"traceparent": bad})
    assert status == 200, text
    trace_id, _, _ = parse_traceparent(headers.get("traceparent"))
    assert trace_id not in bad.lower(), (bad, headers["traceparent"])
    _, line = wait_for_line(cluster.router, trace_id, "traceparent was not used",
                            "the router to log the replacement")
    assert "a new trace starts" in line, line


def test_refused_requests_carry_a_traceparent_too(cluster):
    sent = new_traceparent()
    trace_id, _, _ = parse_traceparent(sent)
    status, headers, text = post(cluster.http_port, "/v1/completions", b"{not json",
                                 {"traceparent": sent})
    assert status == 400, text
    assert parse_traceparent(headers.get("traceparent"))[0] == trace_id, headers
    _, line = wait_for_line(cluster.router, trace_id, "request refused", "the refusal line")
    assert "INVALID_ARGUMENT" in line, line
