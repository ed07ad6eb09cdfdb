"""The clients against fake servers on loopback (port 0): what they send, how they time a stream
(TTFT, inter-token gaps, E2E), where the token count comes from, and that every kind of failure
becomes a failed request with the server's message instead of an exception."""
import asyncio
import json

import pytest

from tandem_bench import clients, runner
from tandem_bench.workload import RequestSpec


def spec(user, index=0, output_len=4, system="", priority=0, model=None, ttft=None, tpot=None):
    return RequestSpec(index=index, system=system, user=user, input_len=1, output_len=output_len,
                       model=model, priority=priority, ttft_slo_ms=ttft, tpot_slo_ms=tpot)


# ------------------------------------------------------------------------------------------------
# A fake OpenAI HTTP server: the prompt (or the user message) picks the behaviour.
# ------------------------------------------------------------------------------------------------


class FakeOpenAI:
    """Answers like Tandem's router; the last word of the prompt picks one of MODES (any other
    word: "ok", 4 tokens after 150 ms, 30 ms apart, with usage)."""
    MODES = ("ok", "busy", "garbage", "slow", "nousage", "midstream", "drop")

    def __init__(self):
        self.bodies = []
        self.paths = []

    async def start(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def stop(self):
        self.server.close()
        await self.server.wait_closed()

    async def handle(self, reader, writer):
        try:
            request_line = await reader.readline()
            headers = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                key, _, value = line.decode().partition(":")
                headers[key.strip().lower()] = value.strip()
            body = json.loads(await reader.readexactly(int(headers["content-length"])))
            self.paths.append(request_line.split()[1].decode())
            self.bodies.append(body)
            mode = (body.get("prompt") or body["messages"][-1]["content"]).split()[-1]
            mode = mode if mode in self.MODES else "ok"
            await self.respond(mode, body, writer)
        finally:
            writer.close()

    @staticmethod
    def sse(obj):
        return f"data: {json.dumps(obj)}\n\n".encode()

    async def respond(self, mode, body, writer):
        if mode == "busy":
            payload = json.dumps({"error": {"message": "over capacity", "type": "rate_limit_error",
                                            "code": "RESOURCE_EXHAUSTED"}}).encode()
            writer.write(b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                         + payload)
            await writer.drain()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        chat = "messages" in body

        def chunk(text):
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            return self.sse({"choices": [choice]})

        if mode == "garbage":
            writer.write(b"data: {not json\n\n")
            await writer.drain()
            return
        if mode == "slow":
            await asyncio.sleep(5)
            return
        await asyncio.sleep(0.15)
        pieces = {"ok": 4, "nousage": 3, "midstream": 2, "drop": 1}[mode]
        for i in range(pieces):
            if i:
                await asyncio.sleep(0.03)
            writer.write(chunk(f" t{i}"))
            await writer.drain()
        if mode == "midstream":
            writer.write(self.sse({"error": {"message": "worker lost", "code": "UNAVAILABLE"}}))
        if mode == "drop":
            await writer.drain()
            return
        if mode == "ok":
            writer.write(self.sse({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                                   "usage": {"prompt_tokens": 7, "completion_tokens": 4}}))
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()


async def with_fake_openai(endpoint, specs, timeout=30.0):
    server = await FakeOpenAI().start()
    client = clients.OpenAIClient(server.url, clients.ClientOptions(endpoint=endpoint,
                                                                    request_timeout_s=timeout))
    try:
        records, _ = await runner.run_rate(client, specs, [0.0] * len(specs), rate=float("inf"))
    finally:
        await client.close()
        await server.stop()
    return server, records


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_openai_stream_timing_and_request_body(endpoint):
    server, [r] = asyncio.run(with_fake_openai(endpoint, [
        spec("ok", output_len=4, system="sys", priority=2, model="m", ttft=300.5)]))
    assert r["ok"], r["error"]
    # The server waits 150 ms, then sends 4 chunks 30 ms apart (upper bounds leave room for a
    # loaded machine).
    assert 145 <= r["ttft_ms"] <= 450
    assert len(r["itl_ms"]) == 3 and all(25 <= x <= 250 for x in r["itl_ms"])
    assert r["e2e_ms"] >= r["ttft_ms"] + sum(r["itl_ms"]) - 1
    assert (r["output_tokens"], r["output_tokens_source"], r["prompt_tokens"]) == (4, "usage", 7)
    assert r["tpot_ms"] == pytest.approx((r["e2e_ms"] - r["ttft_ms"]) / 3)
    assert r["finish_reason"] == "length"
    body = server.bodies[0]
    assert server.paths[0] == ("/v1/chat/completions" if endpoint == "chat" else "/v1/completions")
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["ignore_eos"], body["priority"], body["model"]) == (4, True, 2, "m")
    assert body["slo"] == {"ttft_ms": 300.5}  # no TPOT target: none sent
    if endpoint == "chat":
        assert body["messages"] == [{"role": "system", "content": "sys"},
                                    {"role": "user", "content": "ok"}]
    else:
        assert body["prompt"] == "sys ok"


def test_openai_failures_are_records_not_exceptions():
    specs = [spec(mode, index=i) for i, mode in
             enumerate(["busy", "midstream", "drop", "garbage", "nousage", "slow"])]
    _, records = asyncio.run(with_fake_openai("completions", specs, timeout=1.0))
    by_mode = dict(zip(["busy", "midstream", "drop", "garbage", "nousage", "slow"], records))
    assert by_mode["busy"]["error"] == "HTTP 429: RESOURCE_EXHAUSTED: over capacity"
    assert by_mode["busy"]["status"] == "429"
    assert by_mode["midstream"]["error"] == "UNAVAILABLE: worker lost"
    assert "before data: [DONE]" in by_mode["drop"]["error"]
    assert "not JSON" in by_mode["garbage"]["error"]
    assert "timed out" in by_mode["slow"]["error"]
    for mode in ("busy", "midstream", "drop", "garbage", "slow"):
        assert by_mode[mode]["ok"] is False and by_mode[mode]["tpot_ms"] is None
    # No usage in the stream: the chunks with text are counted.
    r = by_mode["nousage"]
    assert r["ok"] and (r["output_tokens"], r["output_tokens_source"]) == (3, "chunks")


def test_openai_connection_refused_is_a_failed_request():
    async def go():
        server = await FakeOpenAI().start()
        url = server.url
        await server.stop()  # nothing listens there any more
        client = clients.OpenAIClient(url, clients.ClientOptions())
        try:
            return await client.send(spec("ok"), "x")
        finally:
            await client.close()
    outcome = asyncio.run(go())
    assert not outcome.ok and "ConnectError" in outcome.error


def test_openai_base_url_forms():
    for url in ("127.0.0.1:8000", "http://127.0.0.1:8000", "http://127.0.0.1:8000/",
                "http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/"):
        assert clients.openai_base(url) == "http://127.0.0.1:8000/v1"
    assert clients.grpc_target("grpc://h:7000") == "h:7000"


# ------------------------------------------------------------------------------------------------
# A fake tandem.v1.Inference server.
# ------------------------------------------------------------------------------------------------


def predicts(p):
    """Whether this checkout's Timings carries the router's predictions (a newer field)."""
    return "predicted_ttft_us" in p.inference.Timings.DESCRIPTOR.fields_by_name


def fake_inference(p, seen):
    import grpc
    prediction = {"predicted_ttft_us": 80_000} if predicts(p) else {}

    class Servicer(p.inference_grpc.InferenceServicer):
        async def Generate(self, request, context):
            seen.append(request)
            mode = (request.prompt or request.chat.messages[-1].content).split()[-1]
            if mode == "busy":
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "no capacity; retry in 1 s")
            await asyncio.sleep(0.1)
            yield p.inference.GenerateResponse(request_id=request.request_id, token_ids=[1], text="a")
            await asyncio.sleep(0.06)
            if mode == "error":
                yield p.inference.GenerateResponse(
                    request_id=request.request_id, finish_reason=p.inference.FINISH_REASON_ERROR,
                    error_message="decode worker lost")
                return
            # Three tokens in one message: they share the 60 ms gap.
            yield p.inference.GenerateResponse(request_id=request.request_id, token_ids=[2, 3, 4],
                                               text="bcd")
            yield p.inference.GenerateResponse(
                request_id=request.request_id, finish_reason=p.inference.FINISH_REASON_LENGTH,
                usage=p.inference.Usage(prompt_tokens=9, completion_tokens=4,
                                        cached_prompt_tokens=5),
                timings=p.inference.Timings(ttft_us=95_000, e2e_us=160_000, decode_worker="d0",
                                            **prediction))

    return Servicer()


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_grpc_stream_timing_request_and_errors(endpoint):
    import grpc
    p = clients.protos()
    seen = []

    async def go():
        server = grpc.aio.server()
        p.inference_grpc.add_InferenceServicer_to_server(fake_inference(p, seen), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        client = clients.GrpcClient(f"127.0.0.1:{port}", clients.ClientOptions(endpoint=endpoint))
        try:
            await client.connect(10)
            specs = [spec("ok", 0, output_len=4, system="sys", priority=-1, ttft=250.4, tpot=40),
                     spec("busy", 1), spec("error", 2)]
            records, _ = await runner.run_rate(client, specs, [0.0, 0.0, 0.0], rate=float("inf"))
        finally:
            await client.close()
            await server.stop(None)
        return records

    ok, busy, error = asyncio.run(go())
    assert ok["ok"], ok["error"]
    # 100 ms to the first token, then three tokens in one message 60 ms later: three equal gaps.
    assert 95 <= ok["ttft_ms"] <= 400
    assert len(ok["itl_ms"]) == 3 and len(set(ok["itl_ms"])) == 1
    # The gaps are the time between the two messages as received: about 60 ms, less when the
    # first one is read late on a loaded machine; and they add up to E2E - TTFT.
    assert 20 <= sum(ok["itl_ms"]) <= 300
    assert sum(ok["itl_ms"]) == pytest.approx(ok["e2e_ms"] - ok["ttft_ms"], abs=15)
    assert (ok["output_tokens"], ok["prompt_tokens"], ok["cached_prompt_tokens"]) == (4, 9, 5)
    assert ok["finish_reason"] == "length" and ok["decode_worker"] == "d0"
    assert ok["server_ttft_ms"] == pytest.approx(95.0)
    if predicts(p):
        assert (ok["predicted_ttft_ms"], ok["predicted_tpot_ms"]) == (pytest.approx(80.0), None)
    else:
        assert "predicted_ttft_ms" not in ok
    assert busy["ok"] is False and busy["status"] == "RESOURCE_EXHAUSTED"
    assert busy["error"] == "RESOURCE_EXHAUSTED: no capacity; retry in 1 s"
    assert error["ok"] is False and "decode worker lost" in error["error"]
    request = next(r for r in seen if r.request_id.endswith("-0"))
    assert request.sampling.max_tokens == 4 and request.sampling.ignore_eos
    # Whole milliseconds, rounded up.
    assert (request.slo.ttft_ms, request.slo.tpot_ms, request.priority) == (251, 40, -1)
    if endpoint == "chat":
        assert [(m.role, m.content) for m in request.chat.messages] == [("system", "sys"),
                                                                         ("user", "ok")]
    else:
        assert request.prompt == "sys ok"
