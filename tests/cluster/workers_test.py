"""Prefill and decode workers as real processes on loopback: aggregated, disaggregated (KV over
UCX shared memory) and fallback paths give the same greedy tokens; a killed prefill worker costs
no request; cancellation frees the blocks; WatchState's block hashes follow docs/block_hashing.md
(checked with PyPI xxhash); bad requests get clear errors."""
import re
import struct
import threading
import time

import grpc
import pytest
import xxhash

from cluster_common import Process, Protos, wait_until

# Shared memory between the processes on this host (UCX's TCP lanes are not asked for).
UCX = {"UCX_TLS": "posix,self"}
FLAGS = ["--listen=127.0.0.1:0", "--kv_cache_mb=48", "--threads=1", "--max_running=16"]


@pytest.fixture(scope="module")
def pb():
    return Protos()


@pytest.fixture()
def cluster():
    decode = Process("tandem-decode", *FLAGS, "--worker_id=d0", "--metrics_listen=127.0.0.1:0",
                     env=UCX)
    prefill = Process("tandem-prefill", *FLAGS, "--worker_id=p0", "--metrics_listen=127.0.0.1:0",
                      env=UCX)
    yield decode, prefill
    for p in (decode, prefill):
        p.kill()


def generate(pb, decode, prompt, max_tokens=12, targets=(), request_id="", timeout=60,
             priority=0):
    stub = pb.worker_grpc.DecodeStub(grpc.insecure_channel(decode.address))
    request = pb.worker.DecodeRequest(
        request_id=request_id, prompt_token_ids=prompt, priority=priority,
        sampling=pb.inference.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
        prefill_targets=[pb.worker.PrefillTarget(worker_id=w, address=a) for w, a in targets])
    tokens, last = [], None
    for response in stub.Generate(request, timeout=timeout):
        tokens += list(response.token_ids)
        last = response
    return tokens, last


PROMPTS = [[1] + list(range(500, 560)), [1] + list(range(900, 937)), [1, 2, 3] * 30]


def test_disaggregated_fallback_and_aggregated_agree(pb, cluster):
    decode, prefill = cluster
    for prompt in PROMPTS:
        local, last = generate(pb, decode, prompt)
        assert not last.timings.remote_prefill
        remote, last = generate(pb, decode, prompt, targets=[("p0", prefill.address)])
        assert last.timings.remote_prefill and last.timings.prefill_worker == "p0"
        fallback, last = generate(pb, decode, prompt,
                                  targets=[("gone", "127.0.0.1:1"), ("p0", prefill.address)])
        assert last.timings.prefill_worker == "p0"
        assert local == remote == fallback
        assert len(local) == 12 and last.finish_reason == pb.inference.FINISH_REASON_LENGTH


def test_killed_prefill_worker_costs_no_request(pb, cluster):
    decode, prefill = cluster
    prompts = [[1] + list(range(1000 + 40 * i, 1040 + 40 * i)) for i in range(8)]
    expected = [generate(pb, decode, p, max_tokens=24)[0] for p in prompts]
    results = [None] * len(prompts)

    def run(i):
        results[i] = generate(pb, decode, prompts[i], max_tokens=24,
                              targets=[("p0", prefill.address)], timeout=120)[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for i, t in enumerate(threads):
        t.start()
        if i == 3:
            prefill.kill()  # SIGKILL mid-load
    for t in threads:
        t.join(180)
    assert results == expected


def test_prefill_worker_computes_higher_priorities_first(pb, cluster):
    """Four 400-token priority-0 prompts reach the prefill worker (one thread, 512 tokens a
    step: about one and a half of them per step), then a 30-token priority-1 one: it goes into
    the next step, ahead of the priority-0 prompts still waiting, instead of after all of them."""
    decode, prefill = cluster
    target = [("p0", prefill.address)]
    longs = [[1] + list(range(2000 + 400 * i, 2399 + 400 * i)) for i in range(4)]
    short = [1] + list(range(7000, 7029))
    generate(pb, decode, short, max_tokens=2, targets=target)  # warm both workers up
    done = {}

    def run(name, prompt, priority):
        _, last = generate(pb, decode, prompt, max_tokens=2, targets=target, priority=priority,
                           timeout=120)
        assert last.timings.remote_prefill
        done[name] = time.monotonic()

    threads = [threading.Thread(target=run, args=(f"long{i}", p, 0)) for i, p in enumerate(longs)]

    def start_longs():
        for t in threads:
            t.start()

    # Every long prompt reached the prefill worker and at most one step of them is computed (a
    # step's own tokens count as queued until it ends): the short one joins the next step at the
    # latest, and two long ones or more are still waiting after it.
    received = len(longs) * len(longs[0])
    until_load(pb, prefill.address, start_longs,
               lambda base, load: load.prompt_tokens - base.prompt_tokens >= received
               and load.queued_prefill_tokens >= received - 512)
    threads.append(threading.Thread(target=run, args=("short", short, 1)))
    threads[-1].start()
    for t in threads:
        t.join(180)
    assert len(done) == 5, done
    after = sorted(name for name, t in done.items() if t > done["short"])
    assert len(after) >= 2, f"finished after the priority-1 prompt: {after}"


def test_decode_worker_starts_a_higher_priority_prompt_before_finishing_a_long_lower_one(
        pb, cluster):
    """A 1500-token priority-0 prompt prefills locally in steps of 512 tokens (one thread, about
    a second each); a 60-token priority-1 one arriving during the first step is admitted at the
    next, ahead of the long prompt's next chunk, and finishes first. (Taking prompts in progress
    first, it waited for the long prompt's last chunk and finished a step after it.) Meanwhile the
    worker reports its queue by class, which the router reads."""
    decode, _ = cluster
    long_prompt = [1] + list(range(3000, 4499))
    short = [1] + list(range(8000, 8059))
    generate(pb, decode, [1] + list(range(9000, 9019)), max_tokens=2)  # warm up
    done = {}

    def run(name, prompt, priority):
        generate(pb, decode, prompt, max_tokens=2, priority=priority, timeout=120)
        done[name] = time.monotonic()

    threads = [threading.Thread(target=run, args=("long", long_prompt, 0))]
    until_first_step(pb, decode.address, threads[0].start, len(long_prompt))
    threads.append(threading.Thread(target=run, args=("short", short, 1)))
    threads[1].start()
    both = [u.load for u in watch(pb, decode.address,
                                  lambda us: len(us[-1].load.queued_by_priority) >= 2)
            if u.HasField("load") and len(u.load.queued_by_priority) >= 2]
    for t in threads:
        t.join(180)
    assert set(done) == {"long", "short"}
    assert done["short"] < done["long"], "the priority-1 prompt waited for the whole long one"
    assert both, "no load sample showed both classes queued"
    classes = both[-1].queued_by_priority
    assert [c.priority for c in classes] == [1, 0]
    assert sum(c.tokens for c in classes) == both[-1].queued_prefill_tokens
    assert classes[0].prompts == 1 and classes[0].tokens == 60


def test_timings_say_where_the_time_went(pb, cluster):
    """Timings split a request's time into the worker's queue, the prompt's computation, the KV
    move and the decoding. A 60-token prompt arriving while the first step of a 1400-token one of
    the same priority runs (steps of 512 tokens, about a second each) queues for the rest of that
    step and all of the second, and is computed in the last (376 tokens, room for 136 more); the
    long one queues for none. A remote prefill reports the prefill worker's compute and a move
    that ends after it."""
    decode, prefill = cluster
    # Tokens no other test sends: nothing of them is in the prefix cache.
    long_prompt = [1] + list(range(13000, 14399))
    short = [1] + list(range(16000, 16059))
    generate(pb, decode, [1] + list(range(9000, 9019)), max_tokens=2)  # warm up
    last = {}

    def run(name, prompt):
        last[name] = generate(pb, decode, prompt, max_tokens=4, timeout=120)[1]

    threads = [threading.Thread(target=run, args=("long", long_prompt))]
    until_first_step(pb, decode.address, threads[0].start, len(long_prompt))
    threads.append(threading.Thread(target=run, args=("short", short)))
    threads[1].start()
    for t in threads:
        t.join(180)
    assert set(last) == {"long", "short"}
    for name, r in last.items():
        t = r.timings
        assert not t.remote_prefill and t.prefill_worker == "d0" and t.kv_transfer_us == 0, t
        assert t.prefill_us > 0 and t.decode_us > 0, (name, t)
        # Measured on the decode worker from the call's start: the first token came after its
        # queue and its computation, the last one after its decoding too.
        assert t.queue_us + t.prefill_us <= t.ttft_us + 2000, (name, t)
        assert t.decode_us <= t.e2e_us - t.queue_us - t.prefill_us + 2000, (name, t)
    long_t, short_t = last["long"].timings, last["short"].timings
    assert long_t.queue_us < 0.2 * long_t.prefill_us, long_t
    # At least the whole second step of three (the later ones attend to more context: longer).
    assert short_t.queue_us > 0.25 * long_t.prefill_us, (short_t, long_t)
    assert short_t.prefill_us < 0.6 * long_t.prefill_us, (short_t, long_t)

    _, r = generate(pb, decode, PROMPTS[0], targets=[("p0", prefill.address)])
    t = r.timings
    assert t.remote_prefill and t.prefill_worker == "p0", t
    assert t.prefill_us > 0 and t.kv_transfer_us >= t.prefill_us and t.decode_us > 0, t
    assert t.queue_us + t.kv_transfer_us <= t.ttft_us + 2000, t


def until_load(pb, address, start, done, timeout=60):
    """Subscribes to the worker's load samples (every 20 ms), calls `start()`, and returns once
    done(first sample, sample) holds for a sample: an event of the worker's own, seen without the
    delay of subscribing after `start`."""
    stub = pb.worker_grpc.WorkerStateStub(grpc.insecure_channel(address))
    call = stub.WatchState(pb.worker.WatchStateRequest(subscriber="test", load_interval_ms=20),
                           timeout=timeout)
    try:
        base = next(call).snapshot.load  # subscribed
        start()
        for update in call:
            if update.HasField("load") and done(base, update.load):
                return
    finally:
        call.cancel()
    raise AssertionError("the worker's WatchState stream ended")


def until_first_step(pb, address, start, prompt_tokens):
    """Calls `start()` and returns once the worker at `address` reports a step in progress with
    `prompt_tokens` or more queued: the first step of a prompt that long (a step's own prompt
    tokens are counted down only after it)."""
    until_load(pb, address, start, lambda _, load: load.step_elapsed_us > 0
               and load.queued_prefill_tokens >= prompt_tokens)


def watch(pb, address, until, timeout=10):
    stub = pb.worker_grpc.WorkerStateStub(grpc.insecure_channel(address))
    stream = stub.WatchState(pb.worker.WatchStateRequest(subscriber="test", load_interval_ms=50),
                             timeout=timeout)
    updates = []
    try:
        for update in stream:
            updates.append(update)
            if until(updates):
                stream.cancel()
                break
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.CANCELLED:
            raise
    return updates


def block_hashes(model_id, tokens, block_size):
    seed = int.from_bytes(b"TANDEMH1", "little")
    model = xxhash.xxh3_64_intdigest(model_id.encode(), seed=seed)
    out, parent = [], 0
    for s in range(0, len(tokens) - block_size + 1, block_size):
        data = struct.pack("<QQ", parent, model) + struct.pack(f"<{block_size}I", *tokens[s:s + block_size])
        parent = xxhash.xxh3_64_intdigest(data, seed=seed)
        out.append(parent)
    return out


def test_watch_state_events_name_the_prompt_blocks(pb, cluster):
    decode, _ = cluster
    first = watch(pb, decode.address, lambda u: True)[0]
    snapshot = first.snapshot
    assert snapshot.worker_id == "d0" and snapshot.role == pb.worker.ROLE_DECODE
    # The layout only: the pool's keys go to prefill workers, per request (kv_trust_test.py).
    assert snapshot.kv_pool.transport == "ucx" and snapshot.kv_pool.layout.num_layers > 0
    assert not snapshot.kv_pool.regions
    prompt = [1] + list(range(3000, 3047))  # 48 tokens: 3 full blocks
    tokens, _ = generate(pb, decode, prompt, max_tokens=4)
    expected = block_hashes(snapshot.model_id, prompt, snapshot.block_size)
    second = watch(pb, decode.address, lambda u: True)[0].snapshot
    assert set(expected) <= set(second.cached_block_hashes)
    assert second.last_event_id > snapshot.last_event_id


def test_a_quiet_stream_sends_heartbeats(pb):
    """While a stream has nothing to send -- a 1400-token prompt computing on one thread, many
    times the heartbeat interval -- the decode worker sends heartbeats (messages with nothing but
    `heartbeat`), so that the router tells it from a silent worker; tokens then follow as usual."""
    decode = Process("tandem-decode", *FLAGS, "--worker_id=hb", "--stream_heartbeat_ms=50",
                     env=UCX)
    try:
        stub = pb.worker_grpc.DecodeStub(grpc.insecure_channel(decode.address))
        request = pb.worker.DecodeRequest(
            prompt_token_ids=[1] + list(range(20000, 21399)),
            sampling=pb.inference.SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
        responses = list(stub.Generate(request, timeout=120))
        first_token = next(i for i, r in enumerate(responses) if r.token_ids)
        beats = [r for r in responses[:first_token] if r.heartbeat]
        assert beats, "no heartbeat before the first token"
        empty = pb.worker.DecodeResponse(heartbeat=True)
        assert all(r == empty for r in beats), beats[0]
        assert not any(r.heartbeat for r in responses[first_token:] if r.token_ids or r.finish_reason)
        assert sum(len(r.token_ids) for r in responses) == 3
        assert responses[-1].finish_reason
    finally:
        decode.kill()


def test_cancel_mid_stream_frees_the_blocks(pb, cluster):
    decode, _ = cluster
    stub = pb.worker_grpc.DecodeStub(grpc.insecure_channel(decode.address))
    request = pb.worker.DecodeRequest(
        request_id="long", prompt_token_ids=[1] + list(range(100, 200)),
        sampling=pb.inference.SamplingParams(max_tokens=900, temperature=0, ignore_eos=True))
    stream = stub.Generate(request, timeout=120)
    next(stream)
    next(stream)
    stream.cancel()

    def freed():
        loads = [u.load for u in watch(pb, decode.address, lambda u: len(u) > 2) if u.HasField("load")]
        return loads and loads[-1].used_blocks == 0 and loads[-1].running_seqs == 0

    wait_until(freed, what="the cancelled request's blocks to be freed")
    # Still serving.
    assert len(generate(pb, decode, PROMPTS[0], max_tokens=3)[0]) == 3


def test_bad_requests_get_clear_errors(pb, cluster):
    decode, prefill = cluster
    stub = pb.worker_grpc.DecodeStub(grpc.insecure_channel(decode.address))
    with pytest.raises(grpc.RpcError) as error:
        list(stub.Generate(pb.worker.DecodeRequest(model="no-such-model", prompt_token_ids=[1]),
                           timeout=10))
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as error:
        list(stub.Generate(pb.worker.DecodeRequest(prompt_token_ids=[]), timeout=10))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    pstub = pb.worker_grpc.PrefillStub(grpc.insecure_channel(prefill.address))
    with pytest.raises(grpc.RpcError) as error:
        pstub.Prefill(pb.worker.PrefillRequest(token_ids=[1, 2, 3]), timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Both still serve.
    assert len(generate(pb, decode, PROMPTS[1], max_tokens=2, targets=[("p0", prefill.address)])[0]) == 2


def test_worker_metrics_pass_promtool(pb, cluster):
    """/metrics of a decode worker: valid for Prometheus' own promtool, counting what it did, with
    vLLM's gauge names beside Tandem's."""
    import subprocess
    import urllib.request
    decode, _ = cluster
    line = next(l for l in decode.log if "metrics port " in l)
    port = int(line.split("metrics port ")[1].split(")")[0])

    def prompt_tokens(text):
        return int(next(l for l in text.splitlines()
                        if l.startswith("tandem_worker_prompt_tokens_total ")).split()[1])

    def fetch():
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()

    before = prompt_tokens(fetch())  # the start-up calibration's, and earlier tests'
    generate(pb, decode, PROMPTS[0], max_tokens=4)

    def scrape():
        text = fetch()
        return text if prompt_tokens(text) == before + 61 else None

    text = wait_until(scrape, what="the prompt tokens to be counted")
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                           text=True)
    # Exit 1 is a parse error. Exit 3 lists lint problems: the only ones allowed are the colons of
    # vLLM's names, kept on purpose so that vLLM dashboards and autoscalers work unchanged.
    problems = [l for l in (check.stdout + check.stderr).splitlines() if l.strip()]
    assert check.returncode in (0, 3), problems
    assert all(p.startswith("vllm:") and "should not contain ':'" in p for p in problems), problems
    for name in ("tandem_worker_kv_blocks{state=\"used\"}", "tandem_worker_batch_size_bucket",
                 "vllm:num_requests_running", "vllm:gpu_cache_usage_perc"):
        assert name in text, name

    # The prefill worker counts the KV it wrote.
    _, prefill = cluster
    generate(pb, decode, PROMPTS[1], max_tokens=2, targets=[("p0", prefill.address)])
    line = next(l for l in prefill.log if "metrics port " in l)
    pport = int(line.split("metrics port ")[1].split(")")[0])
    ptext = urllib.request.urlopen(f"http://127.0.0.1:{pport}/metrics", timeout=5).read().decode()
    sent = re.search(r"^tandem_prefill_transfer_bytes_total (\S+)$", ptext, re.M)
    assert sent and float(sent.group(1)) > 0, ptext
    assert 'tandem_prefill_requests_total{outcome="ok"}' in ptext
    check = subprocess.run(["promtool", "check", "metrics"], input=ptext, capture_output=True,
                           text=True)
    problems = [l for l in (check.stdout + check.stderr).splitlines() if l.strip()]
    assert all(p.startswith("vllm:") and "should not contain ':'" in p for p in problems), problems


def test_router_finds_workers_through_dns(pb, cluster):
    """--workers_dns: the router resolves a name (here localhost) to its workers, as it does for a
    Kubernetes headless Service, and serves through them."""
    import json
    import urllib.request
    decode, _ = cluster
    router = Process("tandem-router", "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0",
                     f"--workers_dns=localhost:{decode.port}")
    try:
        line = next(l for l in router.log if "http port " in l)
        http = int(line.split("http port ")[1].split(",")[0])

        def healthy():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{http}/health", timeout=2).status == 200
            except OSError:
                return False

        wait_until(healthy, what="the router to find the worker by DNS")
        body = json.dumps({"prompt": "The capital of France is", "max_tokens": 4,
                           "temperature": 0}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{http}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        answer = json.load(urllib.request.urlopen(request, timeout=60))
        assert answer["usage"]["completion_tokens"] == 4
    finally:
        router.kill()


def test_kv_dtype_mismatch_falls_back_to_local_prefill(pb, cluster):
    """A prefill worker whose KV cache has another element type (--kv_dtype=f32 against the
    decode worker's default f16) must not write into the decode worker's pool: the transfer is
    refused, the decode worker prefills locally, and the request gets the same tokens."""
    decode, _ = cluster
    prefill32 = Process("tandem-prefill", *FLAGS, "--kv_dtype=f32", "--worker_id=p32", env=UCX)
    try:
        local, _ = generate(pb, decode, PROMPTS[0])
        tokens, last = generate(pb, decode, PROMPTS[0], targets=[("p32", prefill32.address)])
        assert tokens == local
        assert not last.timings.remote_prefill
        wait_until(lambda: any("--kv_dtype" in line for line in decode.log + prefill32.log),
                   what="a log line that names the mismatched --kv_dtype")
    finally:
        prefill32.kill()
