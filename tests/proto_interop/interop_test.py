#!/usr/bin/env python3
"""Cross-language wire test of the tandem.v1 protos: C++ against Python.

Python code is generated from proto/tandem/v1/*.proto at test time (``python -m
grpc_tools.protoc`` into a temporary folder). The C++ side is ``proto_interop_tool``: its
``write`` mode prints the fixed sample messages of proto/testing/sample_messages.cc as lines of
``<label> <message type> <hex bytes>``; this test parses them and compares them with the same
values built here, then serializes its own messages and has the tool's ``check`` mode verify them.

The sample values here must equal the C++ ones; change both together.

Run by ctest (``proto_interop_python``), which sets the environment:
    TANDEM_PROTO_INTEROP_TOOL  path of the built proto_interop_tool (required)
    TANDEM_PROTO_ROOT          import root of the .proto files (default: this repo's proto/)
or by hand:
    python interop_test.py <path to proto_interop_tool> [<proto root>]

Needs grpcio-tools, protobuf and (under ctest) pytest in the running interpreter.
"""

import difflib
import importlib
import os
import pathlib
import subprocess
import sys
import tempfile
import traceback

from generated_protos import GeneratedProtos

TOOL_ENV = "TANDEM_PROTO_INTEROP_TOOL"
PROTO_ROOT_ENV = "TANDEM_PROTO_ROOT"
DEFAULT_PROTO_ROOT = pathlib.Path(__file__).resolve().parents[2] / "proto"

# ---------------------------------------------------------------------------------------------
# Generated modules and the tool.
# ---------------------------------------------------------------------------------------------


def _Generated():
    return GeneratedProtos(os.environ.get(PROTO_ROOT_ENV) or DEFAULT_PROTO_ROOT)


_GENERATED = None


def generated():
    global _GENERATED
    if _GENERATED is None:
        _GENERATED = _Generated()
    return _GENERATED


def tool_path():
    path = os.environ.get(TOOL_ENV)
    assert path, f"{TOOL_ENV} is not set: it must name the built proto_interop_tool"
    assert os.access(path, os.X_OK), f"{TOOL_ENV}={path} is not an executable file"
    return path


def run_tool(mode, stdin=""):
    return subprocess.run([tool_path(), mode], input=stdin, capture_output=True, text=True,
                          timeout=60, check=False)


# ---------------------------------------------------------------------------------------------
# The samples (the same values as proto/testing/sample_messages.cc).
# ---------------------------------------------------------------------------------------------

REQUEST_ID = "req-0001"
MODEL = "smollm2-135m-instruct"
HASH_A = 0xFEDCBA9876543210
HASH_B = 0x0123456789ABCDEF
HASH_C = 2**64 - 1


def non_utf8(tail):
    return b"\x00\x01\xfe\xff\x80" + tail


def sampling_params(g):
    return g.inference.SamplingParams(
        max_tokens=256, temperature=0.75, top_p=0.5, min_p=0.0, top_k=40,
        repetition_penalty=1.25, frequency_penalty=-0.5, presence_penalty=1.5, seed=2**64 - 1,
        stop=["\n\n", "Ende \U0001F6D1"], stop_token_ids=[2, 128009], ignore_eos=True,
        min_tokens=0, logprobs=5, prompt_logprobs=3)


def token_logprobs(g, token_id):
    return g.inference.TokenLogprobs(
        token_id=token_id, logprob=-0.25,
        top_logprobs=[g.inference.TopLogprob(token_id=token_id, logprob=-0.25),
                      g.inference.TopLogprob(token_id=42, logprob=-1.5)])


def generate_request_chat(g):
    pb = g.inference
    return pb.GenerateRequest(
        request_id=REQUEST_ID, model=MODEL,
        chat=pb.ChatMessages(messages=[
            pb.ChatMessage(role="system", content="You are terse."),
            pb.ChatMessage(role="user", content="Hi \u2014 how are you? \U0001F600"),
            pb.ChatMessage(role="assistant", tool_calls=[tool_call(g)]),
            pb.ChatMessage(role="tool", tool_call_id="call_0", name="get_weather",
                           content='{"celsius": -3.5}'),
        ]),
        sampling=sampling_params(g), slo=pb.Slo(ttft_ms=500, tpot_ms=50), priority=-3,
        omit_text=True,
        tools=[pb.Tool(name="get_weather", description="The weather in a city \u2600",
                       parameters='{"type": "object", "properties": {"city": {"type": "string"}}}',
                       strict=True)],
        tool_choice=pb.ToolChoice(mode=pb.ToolChoice.MODE_FUNCTION, function_name="get_weather"),
        parallel_tool_calls=False)


def tool_call(g):
    return g.inference.ToolCall(id="call_0", name="get_weather",
                                arguments='{"city": "M\u00fcnchen"}')


def generate_response(g):
    pb = g.inference
    token_ids = [450, 1492, 2]
    return pb.GenerateResponse(
        request_id=REQUEST_ID, token_ids=token_ids, text="The end. \u2713",
        logprobs=[token_logprobs(g, t) for t in token_ids],
        prompt_logprobs=[token_logprobs(g, t) for t in (15043, 0)],
        finish_reason=pb.FINISH_REASON_ERROR,
        usage=pb.Usage(prompt_tokens=17, completion_tokens=3, cached_prompt_tokens=16),
        timings=pb.Timings(queue_us=1200, ttft_us=45000, e2e_us=9000000000, prefill_us=30000,
                           kv_transfer_us=2500, decode_us=120000, prefill_worker="prefill-0",
                           decode_worker="decode-1", remote_prefill=True, migrations=1,
                           predicted_ttft_us=120000, predicted_tpot_us=21000),
        error_message="decode worker lost", tool_calls=[tool_call(g)])


def step_timing(g, batch_size, prefill_tokens):
    return g.worker.StepTiming(batch_size=batch_size, prefill_tokens=prefill_tokens,
                               decode_tokens=batch_size - 1, context_tokens=70000,
                               duration_us=18000, attended_tokens=70400,
                               prompt_attended_tokens=400)


def load_sample(g):
    return g.worker.LoadSample(
        timestamp_us=1733140000123456, running_seqs=3, waiting_seqs=2, free_blocks=900,
        used_blocks=124, cached_blocks=300, queued_prefill_tokens=4096, active_decode_tokens=12000,
        recent_steps=[step_timing(g, 4, 512), step_timing(g, 3, 0)],
        prefix_hit_tokens=1 << 40, prompt_tokens=(1 << 41) + 7, step_elapsed_us=1700000,
        finished_seqs=4242,
        queued_by_priority=[g.worker.QueuedClass(priority=2, tokens=96, prompts=1),
                            g.worker.QueuedClass(priority=-1, tokens=4000, prompts=3)],
        draining=True)


def kv_pool(g):
    pb = g.worker
    return pb.KvPoolDescriptor(
        transport="ucx", transport_address=non_utf8(b"ucx-worker"),
        regions=[
            pb.MemoryRegion(base_address=0x7F0000000000, length=1 << 33,
                            remote_key=non_utf8(b"rkey-0"), memory_type=pb.MEMORY_TYPE_CUDA,
                            device_index=1),
            pb.MemoryRegion(base_address=0x7F8000000000, length=1 << 20,
                            remote_key=non_utf8(b"rkey-1"), memory_type=pb.MEMORY_TYPE_HOST),
        ],
        layout=pb.KvLayout(num_layers=30, num_kv_heads=3, head_dim=64, block_size=16,
                           dtype=pb.DTYPE_BF16, block_bytes=12288,
                           layer_stride_bytes=12288 * 1024),
        pool_epoch=7)


def public_kv_pool(g):
    """What a snapshot carries of a pool: no regions (remote keys), no transport address."""
    full = kv_pool(g)
    return g.worker.KvPoolDescriptor(transport=full.transport, layout=full.layout,
                                     pool_epoch=full.pool_epoch)


def worker_state_snapshot(g):
    pb = g.worker
    return pb.WorkerStateUpdate(snapshot=pb.Snapshot(
        worker_id="decode-1", role=pb.ROLE_DECODE, model_id=MODEL, block_size=16,
        total_blocks=1024, free_blocks=900, max_context=8192, max_running=64,
        cached_block_hashes=[HASH_A, HASH_B, HASH_C], last_event_id=41, kv_pool=public_kv_pool(g),
        load=load_sample(g), engine="cpu-avx512", version="0.1.0", max_tokens_per_step=512,
        max_prefill_tokens=128))


def worker_state_kv_events(g):
    pb = g.worker
    return pb.WorkerStateUpdate(kv_events=pb.KvEventBatch(events=[
        pb.KvEvent(event_id=42, stored=pb.BlocksStored(block_hashes=[HASH_A, HASH_B])),
        pb.KvEvent(event_id=43, stored=pb.BlocksStored(parent_hash=0, block_hashes=[HASH_C])),
        pb.KvEvent(event_id=44, removed=pb.BlocksRemoved(block_hashes=[HASH_A])),
        pb.KvEvent(event_id=45, cleared=pb.AllBlocksCleared()),
    ]))


def prefill_request(g):
    pb = g.worker
    return pb.PrefillRequest(
        request_id=REQUEST_ID, model=MODEL, token_ids=[i * 1000 for i in range(1, 41)],
        num_destination_cached_tokens=16,
        destination=pb.KvDestination(worker_id="decode-1", pool=kv_pool(g), block_ids=[17, 3]),
        sampling=sampling_params(g), timeout_ms=1500, num_prior_output_tokens=1,
        priority=2)


SAMPLES = {
    "generate_request_chat": generate_request_chat,
    "generate_response": generate_response,
    "worker_state_snapshot": worker_state_snapshot,
    "worker_state_kv_events": worker_state_kv_events,
    "prefill_request": prefill_request,
}


def python_samples():
    g = generated()
    return {label: build(g) for label, build in SAMPLES.items()}


# ---------------------------------------------------------------------------------------------
# Wire format of the tool: "<label> <type> <hex>" per line.
# ---------------------------------------------------------------------------------------------


def encode_lines(messages):
    return "".join(f"{label} {message.DESCRIPTOR.full_name} {message.SerializeToString().hex()}\n"
                   for label, message in messages.items())


def parse_tool_output(text):
    """Parses the tool's lines into {label: message}, using the type each line names."""
    g = generated()
    pool = g.worker.DESCRIPTOR.pool
    from google.protobuf import message_factory
    parsed = {}
    for line in text.splitlines():
        label, type_name, payload = line.split(" ")
        assert label not in parsed, f"{label} written twice"
        cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(type_name))
        parsed[label] = cls.FromString(bytes.fromhex(payload))
    return parsed


def difference(expected, actual):
    """Empty when equal, else a unified diff of the two messages in text format."""
    if expected == actual:
        return ""
    from google.protobuf import text_format
    diff = difflib.unified_diff(text_format.MessageToString(expected).splitlines(),
                                text_format.MessageToString(actual).splitlines(),
                                "python (expected)", "c++ (actual)", lineterm="")
    return "\n".join(diff) or "messages differ (no difference in text format)"


def unknown_field_count(message):
    from google.protobuf import unknown_fields
    return len(unknown_fields.UnknownFieldSet(message))


# ---------------------------------------------------------------------------------------------
# Tests.
# ---------------------------------------------------------------------------------------------


def test_generated_python_code_has_the_services():
    g = generated()
    assert set(g.inference.DESCRIPTOR.services_by_name) == {"Inference"}
    assert set(g.worker.DESCRIPTOR.services_by_name) == {"WorkerState", "Decode", "Prefill"}
    for module, names in ((g.inference_grpc, ["Inference"]),
                          (g.worker_grpc, ["WorkerState", "Decode", "Prefill"])):
        for name in names:
            assert hasattr(module, f"{name}Stub"), name
            assert hasattr(module, f"{name}Servicer"), name


def test_cpp_writes_what_python_expects():
    result = run_tool("write")
    assert result.returncode == 0, f"proto_interop_tool write failed:\n{result.stderr}"
    from_cpp = parse_tool_output(result.stdout)
    expected = python_samples()
    assert sorted(from_cpp) == sorted(expected), "the C++ and Python sample labels differ"
    problems = []
    for label, message in expected.items():
        if unknown_field_count(from_cpp[label]):
            problems.append(f"{label}: carries fields unknown to the Python code")
        diff = difference(message, from_cpp[label])
        if diff:
            problems.append(f"{label}:\n{diff}")
    assert not problems, "\n".join(problems)


def test_cpp_values_keep_their_meaning_in_python():
    """Spot checks of the values where languages most often disagree."""
    result = run_tool("write")
    assert result.returncode == 0, result.stderr
    m = parse_tool_output(result.stdout)

    request = m["generate_request_chat"]
    assert request.WhichOneof("input") == "chat"
    assert request.chat.messages[1].content == "Hi \u2014 how are you? \U0001F600"
    assert request.priority == -3
    sampling = request.sampling
    assert sampling.seed == 2**64 - 1
    assert sampling.HasField("min_p") and sampling.min_p == 0.0
    assert sampling.HasField("min_tokens") and sampling.min_tokens == 0
    assert sampling.HasField("temperature") and sampling.temperature == 0.75
    assert list(sampling.stop) == ["\n\n", "Ende \U0001F6D1"]

    response = m["generate_response"]
    assert response.finish_reason == generated().inference.FINISH_REASON_ERROR
    assert response.timings.e2e_us == 9000000000
    assert [lp.token_id for lp in response.logprobs] == list(response.token_ids)

    snapshot = m["worker_state_snapshot"]
    assert snapshot.WhichOneof("update") == "snapshot"
    assert list(snapshot.snapshot.cached_block_hashes) == [HASH_A, HASH_B, HASH_C]
    pool = snapshot.snapshot.kv_pool
    assert not pool.regions and not pool.transport_address
    assert generated().worker.DType.Name(pool.layout.dtype) == "DTYPE_BF16"

    events = m["worker_state_kv_events"].kv_events.events
    assert [e.WhichOneof("kind") for e in events] == ["stored", "stored", "removed", "cleared"]
    assert not events[0].stored.HasField("parent_hash")
    assert events[1].stored.HasField("parent_hash") and events[1].stored.parent_hash == 0

    prefill = m["prefill_request"]
    assert list(prefill.destination.block_ids) == [17, 3]
    assert prefill.destination.pool.transport_address == non_utf8(b"ucx-worker")
    assert prefill.destination.pool.regions[0].remote_key == non_utf8(b"rkey-0")
    assert len(prefill.token_ids) == 40


def test_python_writes_what_cpp_expects():
    samples = python_samples()
    # The Python side keeps presence too, before anything crosses the wire.
    assert samples["generate_request_chat"].sampling.HasField("min_p")
    result = run_tool("check", encode_lines(samples))
    assert result.returncode == 0, f"proto_interop_tool check rejected Python's bytes:\n{result.stderr}"
    assert f"{len(samples)} messages match" in result.stdout


def test_cpp_check_names_the_mismatched_fields():
    """The check is not vacuous: changed, unset and missing values are reported by name."""
    samples = python_samples()
    samples["prefill_request"].destination.block_ids[1] = 4
    samples["generate_request_chat"].sampling.ClearField("min_p")
    result = run_tool("check", encode_lines(samples))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "prefill_request" in result.stderr and "block_ids" in result.stderr, result.stderr
    assert "generate_request_chat" in result.stderr and "min_p" in result.stderr, result.stderr

    samples = python_samples()
    del samples["worker_state_kv_events"]
    result = run_tool("check", encode_lines(samples))
    assert result.returncode == 1
    assert "worker_state_kv_events: missing" in result.stderr, result.stderr


def main(argv):
    if len(argv) not in (2, 3):
        print(f"usage: {argv[0]} <path to proto_interop_tool> [<proto root>]", file=sys.stderr)
        return 2
    os.environ[TOOL_ENV] = argv[1]
    if len(argv) == 3:
        os.environ[PROTO_ROOT_ENV] = argv[2]
    tests = [(name, fn) for name, fn in globals().items() if name.startswith("test_") and callable(fn)]
    failed = 0
    for name, fn in tests:
        try:
            fn()
            print(f"PASS {name}")
        except Exception:  # pylint: disable=broad-except
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc()}")
    print(f"{len(tests) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
