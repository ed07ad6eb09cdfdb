"""Faults (issue 8): a decode worker SIGKILLed mid-stream costs no accepted request, and a
restarted router rebuilds its view from the workers and serves at once.

Request migration:
A router in front of 1 prefill + 2 decode workers (round_robin, so both decode workers hold
streams). Every request first runs undisturbed, one at a time, for the reference; then all of them
run at once and one decode worker is killed while they stream. The router moves each request of
the dead worker to the other one with the tokens generated so far; the client's stream goes on
with no error and ends with exactly the reference tokens and text -- greedy, and also seeded
sampling with penalties (the new worker replays the earlier tokens through its sampler), and
seeded sampling under a JSON Schema response_format (and through its grammar). Long
prompts are prefilled remotely again after the move, with the earlier output, so the prefill
worker's first token continues the seeded stream too."""
import json
import urllib.request

import grpc
import pytest

from cluster_common import Cluster, GenerateStream, Protos, greedy_request

MAX_TOKENS = 48


@pytest.fixture(scope="module")
def pb():
    return Protos()


def requests(pb):
    """(name, GenerateRequest) pairs: short prompts (local prefill) and long ones (remote
    prefill, over the router's threshold of 16 uncached tokens), greedy and seeded."""
    long_prompt = ("The history of the lighthouse keepers of the northern coast is long and "
                   "full of storms, shipwrecks and quiet heroism. ") * 3
    out = []
    for i, prompt in enumerate(["Count slowly from one to fifty:", "Tell me about rivers.",
                                long_prompt + "Tell the story of one of them.",
                                long_prompt + "List the dangers they faced."]):
        greedy = pb.inference.SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                             ignore_eos=True)
        out.append((f"greedy{i}", pb.inference.GenerateRequest(prompt=prompt, sampling=greedy)))
        seeded = pb.inference.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, top_p=0.95,
                                             seed=1000 + i, repetition_penalty=1.2,
                                             ignore_eos=True)
        out.append((f"seeded{i}", pb.inference.GenerateRequest(prompt=prompt, sampling=seeded)))
        if i in (1, 2):
            # Under a JSON Schema that no output of MAX_TOKENS tokens completes: the new worker
            # rebuilds the grammar's state from the earlier tokens, or its masks would differ.
            constrained = pb.inference.SamplingParams(
                max_tokens=MAX_TOKENS, temperature=0.8, seed=2000 + i, ignore_eos=True,
                response_format=pb.inference.ResponseFormat(json_schema=RECORDS_SCHEMA))
            out.append((f"json{i}", pb.inference.GenerateRequest(prompt=prompt,
                                                                 sampling=constrained)))
    return out


RECORDS_SCHEMA = json.dumps({
    "type": "object", "required": ["records"],
    "properties": {"records": {"type": "array", "minItems": 100, "items": {
        "type": "object", "required": ["name", "n"],
        "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}}}}})


def migrations_total(cluster):
    text = urllib.request.urlopen(f"http://127.0.0.1:{cluster.http_port}/metrics",
                                  timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("tandem_router_migrations_total{"))


def test_killing_a_decode_worker_mid_stream_loses_no_request(pb):
    cluster = Cluster(prefill=1, decode=2, policy="round_robin", tag="mig")
    try:
        stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))
        work = requests(pb)
        reference = {}
        for name, request in work:
            s = GenerateStream(stub, request)
            s.join()
            assert s.error is None, (name, s.error)
            assert len(s.tokens) == MAX_TOKENS, (name, len(s.tokens))
            if name.startswith("json"):
                assert s.text.startswith('{"records": [{"name": "'), (name, s.text)
            reference[name] = (s.tokens, s.text)

        streams = {name: GenerateStream(stub, request) for name, request in work}
        for name, s in streams.items():
            assert s.flowing.wait(120), f"{name} got no tokens"
        victim = cluster.decode[0]
        victim.kill()  # SIGKILL, mid-stream for every request it holds
        moved = 0
        for name, s in streams.items():
            s.join()
            assert s.error is None, (name, s.error.code(), s.error.details(),
                                     "".join(cluster.router.log[-20:]))
            assert s.tokens == reference[name][0], name
            assert s.text == reference[name][1], name
            assert s.last.finish_reason == pb.inference.FINISH_REASON_LENGTH, name
            assert s.last.usage.completion_tokens == MAX_TOKENS, (name, s.last.usage)
            moved += s.last.timings.migrations
            if s.last.timings.migrations:
                assert s.last.timings.decode_worker == "migd1", (name, s.last.timings)
        # Round robin put half of the streams on the killed worker.
        assert moved >= 2, moved
        assert migrations_total(cluster) == moved
        # The surviving cluster keeps serving new requests.
        after = GenerateStream(stub, work[0][1])
        after.join()
        assert after.error is None and after.tokens == reference[work[0][0]][0]
    finally:
        cluster.stop()


def test_without_migrations_the_client_gets_the_error(pb):
    """--max_migrations=0: the failure reaches the client as UNAVAILABLE, naming the worker."""
    cluster = Cluster(prefill=0, decode=2, policy="round_robin", tag="nomig",
                      router_flags=["--max_migrations=0"])
    try:
        stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))
        streams = [GenerateStream(stub, greedy_request(pb, f"{i}: Tell a long story.", 400))
                   for i in range(2)]
        for s in streams:
            assert s.flowing.wait(120)
        cluster.decode[0].kill()
        for s in streams:
            s.join()
        failed = [s for s in streams if s.error is not None]
        assert len(failed) == 1, [s.error for s in streams]
        assert failed[0].error.code() == grpc.StatusCode.UNAVAILABLE, failed[0].error
        ok = [s for s in streams if s.error is None]
        assert len(ok[0].tokens) == 400
    finally:
        cluster.stop()


def test_a_restarted_router_rebuilds_its_view_from_the_workers(pb):
    """SIGKILL the router and start it again: the workers keep their state (their prefix caches),
    the new router learns it from their WatchState snapshots and serves within about a second,
    and kv_aware places a request on the worker that caches its prefix."""
    cluster = Cluster(prefill=0, decode=2, policy="kv_aware", tag="restart")
    try:
        prefix = ("Rules of the harbour: every boat reports at dawn, nets are mended before noon, "
                  "and no one sails when the red flag flies over the customs house. ") * 4
        greedy = pb.inference.SamplingParams(max_tokens=4, temperature=0)

        def generate(prompt):
            stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))
            last = None
            for response in stub.Generate(pb.inference.GenerateRequest(prompt=prompt,
                                                                        sampling=greedy),
                                          timeout=60):
                last = response
            return last

        first = generate(prefix + "Who reports at dawn?")
        holder = first.timings.decode_worker
        seconds = cluster.restart_router()
        print(f"restarted router healthy after {seconds:.2f} s")
        # "Serves within a second": the bound leaves room for a loaded test machine.
        assert seconds < 2.0, seconds
        again = generate(prefix + "When does no one sail?")
        assert again.timings.decode_worker == holder, (again.timings, holder)
        # All of the shared prefix's full blocks came from the worker's cache.
        assert again.usage.cached_prompt_tokens >= 16 * 4, again.usage
    finally:
        cluster.stop()
