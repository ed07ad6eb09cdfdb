"""The router end to end: tandem-router in front of real tandem-prefill and tandem-decode
processes on loopback, driven through its OpenAI-compatible HTTP API (raw HTTP, curl and the
official `openai` SDK) and its gRPC API (tandem.v1.Inference and grpc.health.v1).

Covered: the same greedy text disaggregated (2 prefill + 2 decode workers), aggregated (one decode
worker) and in one process (`tandem generate`); streaming equals non-streaming; SSE framing; the
gRPC inputs (prompt, chat, token ids), Tokenize, ListModels and the health check; a closed stream
or a cancelled call frees its blocks on the workers; waiting gRPC streams hold no thread each; kv_aware placement beats round_robin on a
shared-prefix workload; a SIGKILLed prefill worker costs no request; bad input gets the right
status and a clear message, and the cluster keeps serving."""
import http.client
import json
import os
import signal
import socket
import struct
import subprocess
import threading
import time

import grpc
import openai
import pytest

from cluster_common import BIN, Cluster, Process, Protos, http_get, http_request, wait_until

MAX_CONTEXT = 8192


# ------------------------------------------------------------------------------------------------
# Helpers: HTTP, SSE, worker state.
# ------------------------------------------------------------------------------------------------


def complete(port, prompt, max_tokens=12, **extra):
    status, body = http_request(port, "POST", "/v1/completions",
                                {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                 "ignore_eos": True, **extra})
    assert status == 200, body
    return body


def chat(port, messages, max_tokens=12, **extra):
    status, body = http_request(port, "POST", "/v1/chat/completions",
                                {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
                                 **extra})
    assert status == 200, body
    return body


def sse_events(lines):
    """The JSON payloads of an SSE stream's "data: " lines; asserts the framing: data lines only,
    every payload JSON, and "data: [DONE]" last."""
    data = [l for l in lines if l.strip()]
    assert data, "empty stream"
    assert all(l.startswith("data: ") for l in data), data
    assert data[-1].strip() == "data: [DONE]", data[-3:]
    events = [json.loads(l[len("data: "):]) for l in data[:-1]]
    assert all("error" not in e for e in events), events
    return events


def load(pb, address, timeout=10):
    """The worker's newest LoadSample (from a WatchState stream)."""
    stub = pb.worker_grpc.WorkerStateStub(grpc.insecure_channel(address))
    stream = stub.WatchState(pb.worker.WatchStateRequest(subscriber="router_test",
                                                         load_interval_ms=50), timeout=timeout)
    try:
        for update in stream:
            if update.HasField("load"):  # a live sample (the snapshot's may be older)
                return update.load
    finally:
        stream.cancel()
    raise AssertionError(f"no load sample from {address}")


def idle(pb, cluster):
    """True when no decode worker holds a block or a sequence."""
    for w in cluster.decode:
        sample = load(pb, w.address)
        if sample.used_blocks or sample.running_seqs or sample.waiting_seqs:
            return False
    return True


def cancelled_requests(cluster):
    """tandem_router_requests_total{outcome="cancelled"} on the router's /metrics."""
    status, text = http_get(cluster.http_port, "/metrics")
    assert status == 200, text
    return sum(float(l.split()[-1]) for l in text.splitlines()
               if l.startswith("tandem_router_requests_total{") and 'outcome="cancelled"' in l)


def wait_idle(pb, cluster, timeout=20, what="the decode workers to free every block"):
    wait_until(lambda: idle(pb, cluster), timeout=timeout, interval=0.1, what=what)


def hit_counters(pb, cluster):
    """(prefix_hit_tokens, prompt_tokens) summed over every worker."""
    samples = [load(pb, w.address) for w in cluster.workers]
    return sum(s.prefix_hit_tokens for s in samples), sum(s.prompt_tokens for s in samples)


def story(seed, sentences):
    """Deterministic English-like text, different for each seed."""
    subjects = ["The farmer", "A sailor", "The old clock", "My neighbour", "The river",
                "A young fox", "The teacher", "The baker", "A lonely lighthouse", "The train"]
    verbs = ["watched", "remembered", "carried", "painted", "followed", "counted", "found",
             "described", "repaired", "visited"]
    objects = ["the morning fog", "a basket of apples", "the northern hills", "an empty letter",
               "the harbour lights", "a broken violin", "the winter market", "seven blue stones",
               "the quiet library", "a map of the coast"]
    out = []
    for i in range(sentences):
        k = seed * 7 + i * 3
        out.append(f"{subjects[k % 10]} {verbs[(k // 10 + i) % 10]} {objects[(k + seed) % 10]}.")
    return " ".join(out)


# ------------------------------------------------------------------------------------------------
# Fixtures.
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pb():
    return Protos()


@pytest.fixture(scope="module")
def cluster():
    """2 prefill + 2 decode workers behind a kv_aware router."""
    c = Cluster(prefill=2, decode=2, policy="kv_aware")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def aggregated():
    """One decode worker, prefilling its own prompts, behind a router."""
    c = Cluster(prefill=0, decode=1, policy="kv_aware", tag="agg-")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def model_id(cluster):
    status, body = http_request(cluster.http_port, "GET", "/v1/models")
    assert status == 200, body
    assert body["object"] == "list" and len(body["data"]) == 1, body
    model = body["data"][0]
    assert model["object"] == "model" and model["max_model_len"] == MAX_CONTEXT, model
    # The default model is a GGUF file of the llama architecture, loaded when the router started.
    assert model["format"] == "gguf" and model["architecture"] == "llama", model
    assert model["owned_by"] == "tandem" and model["created"] > 0, model
    return model["id"]


@pytest.fixture()
def stays_healthy(pb, cluster):
    """After the test: the cluster still answers, and no request is left on a decode worker."""
    yield
    try:
        wait_idle(pb, cluster, timeout=60, what="the cluster to be idle after the test")
        body = complete(cluster.http_port, "The capital of France is", max_tokens=3)
    except Exception as error:  # noqa: BLE001 -- say what the router logged (a crash's stack)
        raise AssertionError(f"{error}\nrouter exit status: {cluster.router.proc.poll()}\n"
                             f"router log:\n{cluster.logs()}") from error
    assert body["usage"]["completion_tokens"] == 3


# ------------------------------------------------------------------------------------------------
# 1. Disaggregated, aggregated and single-process greedy output agree.
# ------------------------------------------------------------------------------------------------

GREEDY_PROMPTS = [
    "The capital of France is",  # 5 tokens: prefilled on the decode worker
    "Once upon a time, in a village at the edge of a great forest, there lived an old woodcutter "
    "and his three daughters. Every morning he",  # ~30 tokens: prefilled remotely
    story(1, 14) + " In the end,",  # ~100 tokens
]
GREEDY_TOKENS = 16


def tandem_generate(prompt, max_tokens):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    p = subprocess.run([str(BIN / "tandem"), "generate", f"--prompt={prompt}",
                        f"--max_tokens={max_tokens}", "--threads=1"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert f"generated: {max_tokens} tokens" in p.stderr and "[length]" in p.stderr, p.stderr
    assert p.stdout.endswith("\n")
    return p.stdout[:-1]


def test_greedy_output_is_the_same_disaggregated_aggregated_and_in_one_process(
        pb, cluster, aggregated):
    before = sum(load(pb, w.address).prompt_tokens for w in cluster.prefill)
    disaggregated = [complete(cluster.http_port, p, GREEDY_TOKENS) for p in GREEDY_PROMPTS]
    # The long prompts went to a prefill worker (local_prefill_threshold=16).
    prefilled = sum(load(pb, w.address).prompt_tokens for w in cluster.prefill) - before
    long_tokens = sum(r["usage"]["prompt_tokens"] for r in disaggregated[1:])
    assert prefilled >= long_tokens, (prefilled, [r["usage"] for r in disaggregated])
    # Again: now from the prefix caches (the decode worker that holds the prompt prefills the rest).
    cached = [complete(cluster.http_port, p, GREEDY_TOKENS) for p in GREEDY_PROMPTS]
    together = [complete(aggregated.http_port, p, GREEDY_TOKENS) for p in GREEDY_PROMPTS]
    single = [tandem_generate(p, GREEDY_TOKENS) for p in GREEDY_PROMPTS]
    for i, prompt in enumerate(GREEDY_PROMPTS):
        d, c, a = disaggregated[i], cached[i], together[i]
        for r in (d, c, a):
            assert r["choices"][0]["finish_reason"] == "length", r
            assert r["usage"]["completion_tokens"] == GREEDY_TOKENS, r
            assert r["usage"]["prompt_tokens"] == d["usage"]["prompt_tokens"], r
        texts = {"disaggregated": d["choices"][0]["text"], "cached": c["choices"][0]["text"],
                 "aggregated": a["choices"][0]["text"], "tandem generate": single[i]}
        assert len(set(texts.values())) == 1, (prompt[:40], texts)
        assert texts["disaggregated"].strip(), texts


# ------------------------------------------------------------------------------------------------
# 2. The official openai SDK.
# ------------------------------------------------------------------------------------------------


# The repeated request may find its prompt cached: cached_tokens may differ from the first's.
CACHED = {"prompt_tokens_details"}


def test_openai_sdk_completions_chat_streaming_usage_and_models(cluster, model_id):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{cluster.http_port}/v1", api_key="unused",
                           max_retries=0, timeout=60)
    models = list(client.models.list())
    assert [m.id for m in models] == [model_id]
    assert models[0].object == "model" and models[0].owned_by == "tandem" and models[0].created > 0
    # Tandem's own fields arrive as the SDK's extras.
    assert models[0].model_extra["max_model_len"] == MAX_CONTEXT
    assert models[0].model_extra["format"] == "gguf"

    prompt = "Write a short poem about the sea:"
    args = dict(model=model_id, prompt=prompt, max_tokens=12, temperature=0,
                extra_body={"ignore_eos": True})
    whole = client.completions.create(**args)
    assert whole.model == model_id and whole.object == "text_completion"
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12 and whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 12
    text, usage, finish = "", None, None
    for chunk in client.completions.create(**args, stream=True,
                                           stream_options={"include_usage": True}):
        assert chunk.model == model_id
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.text
            finish = choice.finish_reason or finish
    assert text == whole.choices[0].text and text.strip()
    assert finish == "length"
    assert usage is not None and usage.model_dump(exclude=CACHED) == whole.usage.model_dump(
        exclude=CACHED)

    messages = [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "Name three colours of the rainbow."}]
    args = dict(model=model_id, messages=messages, max_tokens=12, temperature=0)
    whole = client.chat.completions.create(**args)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].message.content
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.prompt_tokens > 20  # the chat template's tokens are counted
    text, usage, roles, finish = "", None, [], None
    for chunk in client.chat.completions.create(**args, stream=True,
                                                stream_options={"include_usage": True}):
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.delta.role:
                roles.append(choice.delta.role)
            finish = choice.finish_reason or finish
    assert roles == ["assistant"]
    assert text == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.model_dump(exclude=CACHED) == whole.usage.model_dump(
        exclude=CACHED)

    # The SDK's errors carry the router's status and message.
    with pytest.raises(openai.NotFoundError) as error:
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    assert "no-such-model" in str(error.value)
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=model_id, prompt="hi", max_tokens=2, temperature=-1)
    assert "temperature" in str(error.value)


# ------------------------------------------------------------------------------------------------
# 3. curl reads the SSE stream.
# ------------------------------------------------------------------------------------------------


def curl(port, path, body, *flags):
    p = subprocess.run(["curl", "-sN", *flags, f"http://127.0.0.1:{port}{path}",
                        "-H", "Content-Type: application/json", "-d", json.dumps(body)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_curl_reads_server_sent_events(cluster, model_id):
    body = {"model": model_id, "prompt": "List the planets of the solar system:",
            "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    whole = complete(cluster.http_port, body["prompt"], 10)
    out = curl(cluster.http_port, "/v1/completions",
               {**body, "stream": True, "stream_options": {"include_usage": True}},
               "-w", "\n%{http_code} %{content_type}")
    stream, status = out.rsplit("\n", 1)
    assert status.startswith("200 text/event-stream"), status
    # Each event is one "data: {...}" line followed by a blank line.
    assert stream.endswith("data: [DONE]\n\n"), stream[-200:]
    events = sse_events(stream.split("\n"))
    assert all(e["object"] == "text_completion" and e["model"] == model_id for e in events)
    assert len({e["id"] for e in events}) == 1
    assert "".join(c["text"] for e in events for c in e["choices"]) == whole["choices"][0]["text"]
    finishes = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert finishes == ["length"]
    assert events[-1]["choices"] == [] and events[-1]["usage"] == whole["usage"]

    messages = [{"role": "user", "content": "Say hello."}]
    whole = chat(cluster.http_port, messages, 8)
    out = curl(cluster.http_port, "/v1/chat/completions",
               {"messages": messages, "max_tokens": 8, "temperature": 0, "stream": True})
    events = sse_events(out.split("\n"))
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("usage" not in e for e in events)  # not asked for
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert text == whole["choices"][0]["message"]["content"]


# ------------------------------------------------------------------------------------------------
# 4. gRPC: tandem.v1.Inference and the standard health check.
# ------------------------------------------------------------------------------------------------


def grpc_generate(pb, stub, timeout=60, **fields):
    fields.setdefault("sampling", pb.inference.SamplingParams(max_tokens=8, temperature=0,
                                                               ignore_eos=True))
    responses = list(stub.Generate(pb.inference.GenerateRequest(**fields), timeout=timeout))
    assert responses, "empty stream"
    last = responses[-1]
    assert all(r.finish_reason == pb.inference.FINISH_REASON_UNSPECIFIED for r in responses[:-1])
    tokens = [t for r in responses for t in r.token_ids]
    text = "".join(r.text for r in responses)
    return tokens, text, last, responses


def test_grpc_generate_tokenize_list_models_and_health(pb, cluster, model_id):
    channel = grpc.insecure_channel(cluster.grpc_address)
    stub = pb.inference_grpc.InferenceStub(channel)

    models = stub.ListModels(pb.inference.ListModelsRequest(), timeout=10).models
    assert [m.id for m in models] == [model_id]
    assert models[0].max_context == MAX_CONTEXT and models[0].vocab_size > 1000
    assert models[0].owned_by == "tandem"

    prompt = "The capital of France is"
    tokenized = stub.Tokenize(pb.inference.TokenizeRequest(prompt=prompt, return_pieces=True),
                              timeout=10)
    assert tokenized.max_model_len == MAX_CONTEXT
    assert len(tokenized.token_ids) == len(tokenized.pieces) >= 4
    assert b"".join(tokenized.pieces).decode() == prompt

    # A prompt and its token ids give the same tokens; the request id comes back on every message.
    tokens, text, last, responses = grpc_generate(pb, stub, prompt=prompt, request_id="grpc-1")
    assert all(r.request_id == "grpc-1" for r in responses)
    assert len(tokens) == 8 and text.strip()
    assert last.finish_reason == pb.inference.FINISH_REASON_LENGTH
    assert last.usage.prompt_tokens == len(tokenized.token_ids)
    assert last.usage.completion_tokens == 8
    assert last.timings.decode_worker in ("d0", "d1")
    assert last.timings.e2e_us >= last.timings.ttft_us > 0
    ids = pb.inference.TokenIds(ids=tokenized.token_ids)
    by_ids, by_ids_text, last_ids, responses = grpc_generate(pb, stub, token_ids=ids)
    assert by_ids == tokens and by_ids_text == text
    assert responses[0].request_id  # generated by the router
    # The same as the HTTP API.
    assert complete(cluster.http_port, prompt, 8)["choices"][0]["text"] == text

    # Chat: Tokenize applies the template as Generate does; HTTP gives the same answer.
    messages = [pb.inference.ChatMessage(role="user", content="What is two plus two?")]
    chat_tokens = stub.Tokenize(pb.inference.TokenizeRequest(
        chat=pb.inference.ChatMessages(messages=messages)), timeout=10).token_ids
    _, chat_text, last, _ = grpc_generate(
        pb, stub, chat=pb.inference.ChatMessages(messages=messages),
        sampling=pb.inference.SamplingParams(max_tokens=10, temperature=0))
    assert last.usage.prompt_tokens == len(chat_tokens) > 10
    http_chat = chat(cluster.http_port, [{"role": "user", "content": "What is two plus two?"}], 10)
    assert http_chat["choices"][0]["message"]["content"] == chat_text
    assert http_chat["usage"]["prompt_tokens"] == len(chat_tokens)

    # A long prompt nobody has cached is prefilled on a prefill worker, its KV moved over.
    _, _, last, _ = grpc_generate(pb, stub, prompt=story(40, 12))
    assert last.timings.remote_prefill, last.timings
    assert last.timings.prefill_worker in ("p0", "p1"), last.timings

    # grpc.health.v1.Health/Check for the server as a whole ("" service): SERVING (status = 1).
    try:
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                              timeout=10)
        assert response.status == health_pb2.HealthCheckResponse.SERVING
    except ImportError:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        assert check(b"", timeout=10) == b"\x08\x01"


# ------------------------------------------------------------------------------------------------
# 5. Cancellation frees the blocks.
# ------------------------------------------------------------------------------------------------

LONG_GENERATION = {"prompt": "Tell me a long story about a dragon.", "max_tokens": 1000,
                   "temperature": 0, "ignore_eos": True}


def running(pb, cluster):
    return sum(load(pb, w.address).running_seqs for w in cluster.decode)


def test_closing_an_http_stream_frees_the_blocks(pb, cluster, stays_healthy):
    conn = http.client.HTTPConnection("127.0.0.1", cluster.http_port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps({**LONG_GENERATION, "stream": True}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    lines = [response.readline() for _ in range(4)]
    assert lines[0].startswith(b"data: {") and lines[2].startswith(b"data: {"), lines
    assert running(pb, cluster) == 1
    conn.sock.shutdown(socket.SHUT_RDWR)
    response.close()
    conn.close()
    # 1000 tokens take about 20 s here: only a cancellation frees the blocks this soon.
    wait_idle(pb, cluster, timeout=15, what="the closed stream's blocks to be freed")


def test_clients_that_reset_their_streams_cost_the_router_nothing(pb, cluster, stays_healthy):
    """Clients that close or reset their connections while tokens flow: a write the router makes
    after that fails with EPIPE, which must end that stream only (a SIGPIPE once killed the
    router here)."""
    body = json.dumps({**LONG_GENERATION, "stream": True}).encode()
    cancelled = cancelled_requests(cluster)
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: router\r\n"
               b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    for _ in range(3):
        clients = [socket.create_connection(("127.0.0.1", cluster.http_port), timeout=30)
                   for _ in range(8)]
        for client in clients:
            client.sendall(request)
        for client in clients:
            received = b""
            while received.count(b"data: {") < 2:
                chunk = client.recv(65536)
                assert chunk, received
                received += chunk
            assert received.startswith(b"HTTP/1.1 200"), received[:200]
        for i, client in enumerate(clients):
            if i % 2:  # linger 0: close() sends RST and drops what was not read
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:  # FIN: the router's next write draws a RST, the one after it EPIPE
                client.shutdown(socket.SHUT_RDWR)
            client.close()
        # The router found every one of them gone (a write to it failed, or its close came) and
        # ended its stream.
        cancelled += len(clients)
        wait_until(lambda: cancelled_requests(cluster) >= cancelled, timeout=60,
                   what="the router to end the reset streams")
        assert cluster.router.proc.poll() is None, cluster.logs()
    wait_idle(pb, cluster, timeout=30, what="the reset streams' blocks to be freed")


def test_every_process_ignores_sigpipe(cluster):
    """A peer's closed socket is an error on that connection, never the end of the process:
    the router and both worker kinds ignore SIGPIPE (bit 13 of SigIgn)."""
    for process in [cluster.router, *cluster.prefill, *cluster.decode]:
        with open(f"/proc/{process.proc.pid}/status") as f:
            ignored = next(int(l.split()[1], 16) for l in f if l.startswith("SigIgn:"))
        assert ignored & (1 << (signal.SIGPIPE - 1)), (process.proc.args[0], hex(ignored))


def test_cancelling_a_grpc_call_frees_the_blocks(pb, cluster, stays_healthy):
    stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))
    call = stub.Generate(pb.inference.GenerateRequest(
        prompt=LONG_GENERATION["prompt"],
        sampling=pb.inference.SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True)),
        timeout=120)
    next(call)
    next(call)
    assert running(pb, cluster) == 1
    call.cancel()
    with pytest.raises(grpc.RpcError) as error:
        for _ in call:
            pass
    assert error.value.code() == grpc.StatusCode.CANCELLED
    wait_idle(pb, cluster, timeout=15, what="the cancelled call's blocks to be freed")


def threads(process):
    with open(f"/proc/{process.proc.pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("Threads:"))


def test_waiting_grpc_streams_hold_no_thread_each(pb, cluster, stays_healthy):
    """Both gRPC hops use the callback API: 200 open streams, most of them queued on the decode
    workers, leave the router's and the workers' thread counts where they were (a thread per
    stream would add 200 to the router and about 100 to each decode worker). Cancelling them
    all frees every block."""
    before = {p.proc.pid: threads(p) for p in [cluster.router] + cluster.decode}
    stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))
    calls = [stub.Generate(pb.inference.GenerateRequest(
        prompt=f"{i}: {LONG_GENERATION['prompt']}",
        sampling=pb.inference.SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True)),
        timeout=120) for i in range(200)]
    try:
        def held():
            samples = [load(pb, w.address) for w in cluster.decode]
            return sum(s.running_seqs + s.waiting_seqs for s in samples) == len(calls)

        wait_until(held, timeout=60, interval=0.2, what="the decode workers to hold every stream")
        for p in [cluster.router] + cluster.decode:
            grown = threads(p) - before[p.proc.pid]
            assert grown < 20, (p.proc.args[0], before[p.proc.pid], threads(p))
    finally:
        for call in calls:
            call.cancel()
    wait_idle(pb, cluster, timeout=30, what="the cancelled streams' blocks to be freed")


# ------------------------------------------------------------------------------------------------
# 6. kv_aware placement finds the cached prefix; round_robin does not.
# ------------------------------------------------------------------------------------------------


def shared_prefix_workload(pb, cluster, groups=3, per_group=4):
    """Prompts of `groups` ~330-token shared prefixes with short distinct suffixes, interleaved
    (A1 B1 C1 A2 ...). Each prefix is a whole number of blocks and a token prefix of its prompts,
    so a worker that cached it lacks only the suffix (under local_prefill_threshold)."""
    stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))

    def tokens(text):
        return list(stub.Tokenize(pb.inference.TokenizeRequest(prompt=text), timeout=10).token_ids)

    prefixes = []
    for g in range(groups):
        prefix = f"Background document {g}.\n" + story(100 + g, 38)
        for _ in range(40):  # pad with one-token words up to a whole number of blocks
            if len(tokens(prefix)) % 16 == 0:
                break
            prefix += " and"
        assert len(tokens(prefix)) % 16 == 0, len(tokens(prefix))
        prefixes.append(prefix)
    prompts = []
    for i in range(per_group):
        for g, prefix in enumerate(prefixes):
            prompt = f"{prefix}\nQuestion {i}: who?"
            shared = tokens(prefix)
            full = tokens(prompt)
            assert len(shared) >= 300 and full[:len(shared)] == shared
            assert len(full) - len(shared) <= 12, len(full) - len(shared)
            prompts.append(prompt)
    return prompts


def await_router_holds_kv_events(pb, cluster):
    """Returns once the router's view of every worker holds the KV events the worker has emitted
    by now (tandem_router_worker_kv_event_id against the worker's own last_event_id)."""
    for w in cluster.workers:
        stub = pb.worker_grpc.WorkerStateStub(grpc.insecure_channel(w.address))
        call = stub.WatchState(pb.worker.WatchStateRequest(subscriber="router_test"), timeout=10)
        try:
            emitted = next(call).snapshot.last_event_id
        finally:
            call.cancel()

        def held():
            status, text = http_get(cluster.http_port, "/metrics")
            prefix = f'tandem_router_worker_kv_event_id{{worker="{w.address}"}} '
            return status == 200 and any(l.startswith(prefix) and float(l.split()[-1]) >= emitted
                                         for l in text.splitlines())
        wait_until(held, timeout=30, interval=0.02,
                   what=f"the router to hold {w.address}'s KV events up to {emitted}")


def prefix_hit_rate(pb, policy, tag):
    c = Cluster(prefill=2, decode=2, policy=policy, tag=tag)
    try:
        prompts = shared_prefix_workload(pb, c)
        # The workers' start-up calibration is counted too: take the workload's part only.
        hits_before, total_before = hit_counters(pb, c)
        for prompt in prompts:
            complete(c.http_port, prompt, max_tokens=2)
            await_router_holds_kv_events(pb, c)
        hits, total = hit_counters(pb, c)
        hits, total = hits - hits_before, total - total_before
        assert total >= sum(len(p) // 8 for p in prompts), (hits, total)
        return hits / total
    finally:
        c.stop()


def test_kv_aware_placement_hits_the_prefix_cache_more_than_round_robin(pb):
    kv_aware = prefix_hit_rate(pb, "kv_aware", "kv-")
    round_robin = prefix_hit_rate(pb, "round_robin", "rr-")
    # kv_aware: only the first prompt of each prefix misses; round_robin sends each prefix to both
    # decode workers (and alternates the prefill workers), missing twice as often.
    assert kv_aware > round_robin + 0.1, (kv_aware, round_robin)
    assert kv_aware > 0.5, kv_aware


# ------------------------------------------------------------------------------------------------
# 7. A SIGKILLed prefill worker costs no request.
# ------------------------------------------------------------------------------------------------


def test_killing_a_prefill_worker_under_load_loses_no_request(pb, aggregated):
    prompts = [f"Chapter {i}. " + story(200 + i, 16) for i in range(8)]
    expected = [complete(aggregated.http_port, p, 16)["choices"][0]["text"] for p in prompts]
    c = Cluster(prefill=2, decode=2, policy="kv_aware", tag="kill-")
    try:
        results = [None] * len(prompts)

        def run(i):
            try:
                results[i] = http_request(c.http_port, "POST", "/v1/completions",
                                          {"prompt": prompts[i], "max_tokens": 16,
                                           "temperature": 0, "ignore_eos": True}, timeout=120)
            except Exception as error:  # noqa: BLE001 (reported by the assertion below)
                results[i] = (0, repr(error))

        threads = [threading.Thread(target=run, args=(i,), daemon=True)
                   for i in range(len(prompts))]
        for t in threads:
            t.start()
        victim = c.prefill[0]
        # Kill it while it has prompts to compute.
        wait_until(lambda: (lambda s: s.running_seqs + s.waiting_seqs > 0
                            or s.queued_prefill_tokens > 0)(load(pb, victim.address)),
                   timeout=30, interval=0.01, what="p0 to be prefilling")
        victim.kill()
        for t in threads:
            t.join(180)
        for i, (status, body) in enumerate(results):
            assert status == 200, (i, body, c.logs())
            assert body["choices"][0]["text"] == expected[i], (i, body, expected[i])
            assert body["usage"]["completion_tokens"] == 16
        # Still serving, with the one prefill worker left.
        assert complete(c.http_port, "Chapter 99. " + story(299, 16), 4)["usage"][
            "completion_tokens"] == 4
    finally:
        c.stop()


# ------------------------------------------------------------------------------------------------
# 8. Bad input: the right status, a clear message, and the cluster keeps serving.
# ------------------------------------------------------------------------------------------------


def test_bad_http_input_gets_the_right_status_and_message(cluster, model_id, stays_healthy):
    port = cluster.http_port
    too_long = "hello " * (MAX_CONTEXT + 100)
    cases = [
        ("/v1/completions", {"prompt": "", "max_tokens": 4}, 400, "empty"),
        ("/v1/completions", {"prompt": too_long, "max_tokens": 4}, 400, "8191"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": MAX_CONTEXT + 1}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "temperature": -0.5}, 400,
         "temperature"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "model": "gpt-9"}, 404, "gpt-9"),
        ("/v1/completions", {"max_tokens": 4}, 400, "prompt"),
        ("/v1/completions", {"prompt": [10**9], "max_tokens": 4}, 400, "vocabulary"),
        ("/v1/chat/completions", {"messages": [], "max_tokens": 4}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, 400,
         "robot"),
        ("/v1/chat/completions", {"model": "gpt-9", "messages": [{"role": "user",
                                                                  "content": "hi"}]}, 404,
         "gpt-9"),
    ]
    for path, body, status, word in cases:
        for stream in (False, True):
            got, reply = http_request(port, "POST", path, {**body, "stream": stream})
            assert got == status, (path, body if len(json.dumps(body)) < 200 else "...", reply)
            assert isinstance(reply, dict) and word in reply["error"]["message"], reply
            assert reply["error"]["type"] == "invalid_request_error", reply
    # Not JSON, or not an object.
    for raw in (b'{"prompt": "hi",', b"[1, 2]", b"", b"\xff\xfe"):
        got, reply = http_request(port, "POST", "/v1/completions", raw)
        assert got == 400, (raw, reply)
        assert isinstance(reply, dict) and reply["error"]["message"], reply
    got, reply = http_request(port, "GET", "/v1/no/such/path")
    assert got == 404 and "/v1/no/such/path" in reply["error"]["message"], reply


def test_bad_grpc_input_gets_the_right_code_and_message(pb, cluster, model_id, stays_healthy):
    stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))
    SP = pb.inference.SamplingParams
    cases = [
        (dict(prompt=""), grpc.StatusCode.INVALID_ARGUMENT, "empty"),
        (dict(), grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
        (dict(prompt="hello " * (MAX_CONTEXT + 100)), grpc.StatusCode.INVALID_ARGUMENT, "8191"),
        (dict(prompt="hi", sampling=SP(max_tokens=0)), grpc.StatusCode.INVALID_ARGUMENT,
         "max_tokens"),
        (dict(prompt="hi", sampling=SP(max_tokens=MAX_CONTEXT + 1)),
         grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"),
        (dict(prompt="hi", sampling=SP(max_tokens=4, temperature=-1)),
         grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
        (dict(prompt="hi", model="gpt-9"), grpc.StatusCode.NOT_FOUND, "gpt-9"),
        (dict(token_ids=pb.inference.TokenIds(ids=[])), grpc.StatusCode.INVALID_ARGUMENT,
         "empty"),
        (dict(token_ids=pb.inference.TokenIds(ids=[1, -5])), grpc.StatusCode.INVALID_ARGUMENT,
         "vocabulary"),
        (dict(chat=pb.inference.ChatMessages()), grpc.StatusCode.INVALID_ARGUMENT, "messages"),
    ]
    for fields, code, word in cases:
        with pytest.raises(grpc.RpcError) as error:
            list(stub.Generate(pb.inference.GenerateRequest(**fields), timeout=30))
        assert error.value.code() == code, (fields.keys(), error.value)
        assert word in error.value.details(), (fields.keys(), error.value.details())
    with pytest.raises(grpc.RpcError) as error:
        stub.Tokenize(pb.inference.TokenizeRequest(model="gpt-9", prompt="hi"), timeout=10)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_http_body_over_the_size_limit_is_413(cluster, stays_healthy):
    """The router's default --max_body_bytes is 8 MiB: a 9 MiB body gets 413 and says why."""
    body = b'{"prompt": "' + b"a" * (9 << 20) + b'", "max_tokens": 1}'
    # curl sends "Expect: 100-continue" with a body this large, so the server can refuse it
    # before the upload; "Expect:" (empty) makes curl send it all.
    for expect in ([], ["-H", "Expect:"]):
        p = subprocess.run(["curl", "-sS", *expect, "-H", "Content-Type: application/json",
                            "--data-binary", "@-", "-w", "\n%{http_code}",
                            f"http://127.0.0.1:{cluster.http_port}/v1/completions"],
                           input=body, capture_output=True, timeout=60)
        out, status = p.stdout.decode("utf-8", "replace").rsplit("\n", 1)
        assert status == "413", (expect, status, out[:300], p.stderr[:300])
        try:
            message = json.loads(out)["error"]["message"]  # the API's error shape
        except ValueError:
            # libevent 2.1 answers with its own HTML page (evhttp_send_error), not the JSON
            # error shape that http_server.h promises: accepted here, as long as it says why.
            message = out
        assert "too large" in message.lower() or "bytes" in message, out[:300]
    # A body under the limit is read and parsed (here: rejected for its prompt's length).
    got, reply = http_request(cluster.http_port, "POST", "/v1/completions",
                              {"prompt": "a " * 10000, "max_tokens": 1})
    assert got == 400 and "8191" in reply["error"]["message"], reply


def test_wrong_http_method_is_405(cluster, stays_healthy):
    """A known path with a method it does not take: 405 Method Not Allowed (RFC 9110 §15.5.6),
    in the API's JSON error shape."""
    port = cluster.http_port
    for method, path in [("GET", "/v1/completions"), ("GET", "/v1/chat/completions"),
                         ("POST", "/v1/models"), ("PUT", "/v1/completions"),
                         ("DELETE", "/v1/models"), ("POST", "/metrics")]:
        got, reply = http_request(port, method, path, b"{}" if method != "GET" else None)
        assert got == 405, (method, path, got, reply)
        assert isinstance(reply, dict) and reply["error"]["message"], (method, path, reply)


def test_a_client_that_disconnects_before_the_reply_cancels_its_request(pb, cluster,
                                                                         stays_healthy):
    """http_server.h: "A client that disconnects cancels its request" -- also without "stream"."""
    conn = http.client.HTTPConnection("127.0.0.1", cluster.http_port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(LONG_GENERATION),
                 {"Content-Type": "application/json"})
    wait_until(lambda: running(pb, cluster) == 1, timeout=10, what="the request to run")
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    # 1000 tokens take about 20 s here: only a cancellation frees the blocks this soon.
    wait_idle(pb, cluster, timeout=12, what="the disconnected client's request to be cancelled")
