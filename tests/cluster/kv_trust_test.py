"""The KV path's trust boundary (docs/security.md, "The KV path"), with real processes on loopback.

- A decode worker's remote keys are not public state: its WatchState snapshot (read over gRPC)
  carries the pool's layout and no region, key or transport address, while the PrefillRequest it
  sends the prefill worker a request names (a grpcio Prefill server here, which records it and
  refuses, so the decode worker prefills itself) carries them; and no form of the key appears in
  the decode or prefill worker's log or metrics.
- A decode worker whose client leaves during a remote prefill sends Prefill.Cancel and keeps the
  request's blocks until it answers (a prefill worker's late writes land in no other request's).
- A real tandem-prefill given a grant over real UCX (shared memory, and TCP) into a pool filled
  with a canary (tests/kvtransfer/kv_peer): an out-of-range, duplicated, miscounted grant or a
  pool of another layout is refused and writes nothing; a valid one changes exactly the granted
  blocks, not the block the destination caches.

Environment: TANDEM_BIN_DIR (the binaries, kv_peer included), TANDEM_SOURCE_DIR. About 13 s.
"""
import base64
import itertools
import queue
import subprocess
import threading
import urllib.request
from concurrent import futures

import grpc
import pytest

from cluster_common import BIN, Process, Protos, wait_until

UCX = {"UCX_TLS": "posix,self"}
FLAGS = ["--listen=127.0.0.1:0", "--kv_cache_mb=48", "--threads=1", "--max_running=8"]
WAIT_S = 60
REQUEST_IDS = itertools.count()


@pytest.fixture(scope="module")
def pb():
    return Protos()


def metrics_text(process):
    line = next(l for l in process.log if "metrics port " in l)
    port = int(line.split("metrics port ")[1].split(")")[0])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def snapshot_of(pb, address):
    stub = pb.worker_grpc.WorkerStateStub(grpc.insecure_channel(address))
    stream = stub.WatchState(pb.worker.WatchStateRequest(), timeout=WAIT_S)
    first = next(iter(stream))
    stream.cancel()
    assert first.WhichOneof("update") == "snapshot"
    return first.snapshot


def generate(pb, decode, prompt, targets):
    stub = pb.worker_grpc.DecodeStub(grpc.insecure_channel(decode.address))
    request = pb.worker.DecodeRequest(
        request_id=f"trust-{next(REQUEST_IDS)}", prompt_token_ids=prompt,
        sampling=pb.inference.SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
        prefill_targets=[pb.worker.PrefillTarget(worker_id=w, address=a) for w, a in targets])
    tokens, last = [], None
    for response in stub.Generate(request, timeout=WAIT_S):
        tokens += list(response.token_ids)
        last = response
    return tokens, last


class FakePrefill:
    """A tandem.v1.Prefill server on loopback that serves with `servicer`."""

    def __init__(self, pb, servicer, threads):
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
        pb.worker_grpc.add_PrefillServicer_to_server(servicer, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def stop(self):
        self.server.stop(None)


class RecordingPrefill(FakePrefill):
    """A tandem.v1.Prefill server that records each request and refuses it (UNAVAILABLE)."""

    def __init__(self, pb):
        self.requests = []
        recorder = self

        class Servicer(pb.worker_grpc.PrefillServicer):
            def Prefill(self, request, context):
                recorder.requests.append(request)
                context.abort(grpc.StatusCode.UNAVAILABLE, "recorded, not served")

        super().__init__(pb, Servicer(), threads=2)


def forms_of(key):
    """How a key could show up in text: hex (either case), base64 (either alphabet), C escapes."""
    return [key.hex(), key.hex().upper(), base64.b64encode(key).decode(),
            base64.urlsafe_b64encode(key).decode().rstrip("="),
            "".join(f"\\x{b:02x}" for b in key[:16]), "".join(f"\\{b:03o}" for b in key[:16])]


def test_keys_reach_only_the_named_prefill_worker_never_state_logs_or_metrics(pb):
    decode = Process("tandem-decode", *FLAGS, "--worker_id=d0", "--metrics_listen=127.0.0.1:0",
                     env=UCX)
    prefill = Process("tandem-prefill", *FLAGS, "--worker_id=p0", "--metrics_listen=127.0.0.1:0",
                      env=UCX)
    recorder = RecordingPrefill(pb)
    try:
        snapshot = snapshot_of(pb, decode.address)
        pool = snapshot.kv_pool
        # What the router needs: the layout. No region, key or address.
        assert pool.transport == "ucx" and pool.layout.num_layers > 0 and pool.layout.block_bytes > 0
        assert len(pool.regions) == 0 and pool.transport_address == b""

        prompt = [1] + list(range(4000, 4040))
        local, _ = generate(pb, decode, prompt, [])
        tokens, last = generate(pb, decode, prompt, [("rec", recorder.address)])
        assert tokens == local and not last.timings.remote_prefill  # refused: prefilled locally
        assert len(recorder.requests) == 1
        sent = recorder.requests[0].destination
        assert sent.worker_id == "d0" and sent.pool.transport_address
        key = sent.pool.regions[0].remote_key
        assert len(key) >= 8 and sent.pool.layout == pool.layout

        # A real prefill worker gets the same key, and serves.
        tokens, last = generate(pb, decode, [1] + list(range(5000, 5040)), [("p0", prefill.address)])
        assert last.timings.remote_prefill and last.timings.prefill_worker == "p0"
        # Held while the prefill worker could write, released once the request and it are done.
        wait_until(lambda: snapshot_of(pb, decode.address).load.used_blocks == 0,
                   what="the remote prefill's blocks to be released")

        # The key in no snapshot byte, log line or metric, in any usual text form.
        assert key not in snapshot_of(pb, decode.address).SerializeToString()
        for process in (decode, prefill):
            text = "".join(process.log) + metrics_text(process)
            for form in forms_of(key):
                assert form not in text, f"{form[:24]}... in the log or metrics"
    finally:
        recorder.stop()
        decode.kill()
        prefill.kill()


class HangingPrefill(FakePrefill):
    """A tandem.v1.Prefill server that takes a prefill and never answers it (a prefill worker
    whose writes are still in flight), and answers Prefill.Cancel only when the test says so."""

    def __init__(self, pb):
        self.prefill_received = threading.Event()
        self.cancel_received = threading.Event()
        self.answer_cancel = threading.Event()
        self.done = threading.Event()
        hanging = self

        class Servicer(pb.worker_grpc.PrefillServicer):
            def Prefill(self, request, context):
                hanging.prefill_received.set()
                hanging.done.wait(WAIT_S)
                context.abort(grpc.StatusCode.UNAVAILABLE, "never served")

            def Cancel(self, request, context):
                hanging.cancel_received.set()
                hanging.answer_cancel.wait(WAIT_S)
                return pb.worker.CancelResponse(found=True)

        super().__init__(pb, Servicer(), threads=4)

    def stop(self):
        self.answer_cancel.set()
        self.done.set()
        super().stop()


def test_an_aborted_remote_prefill_keeps_its_blocks_until_the_prefill_worker_cancelled(pb):
    """The client leaves while a prefill worker may still be writing the prompt's blocks: the
    decode worker keeps them (they go to no other request) until that worker's Prefill.Cancel
    answers, which it does once nothing more can land."""
    decode = Process("tandem-decode", *FLAGS, "--worker_id=d0", env=UCX)
    hanging = HangingPrefill(pb)
    try:
        stub = pb.worker_grpc.DecodeStub(grpc.insecure_channel(decode.address))
        prompt = [1] + list(range(7000, 7040))  # 41 tokens: 3 blocks of 16
        stream = stub.Generate(pb.worker.DecodeRequest(
            request_id="aborted", prompt_token_ids=prompt,
            sampling=pb.inference.SamplingParams(max_tokens=4, temperature=0),
            prefill_targets=[pb.worker.PrefillTarget(worker_id="hang", address=hanging.address)]),
            timeout=WAIT_S)
        assert hanging.prefill_received.wait(WAIT_S)
        stream.cancel()  # the client goes away
        assert hanging.cancel_received.wait(WAIT_S), "the decode worker sent no Prefill.Cancel"
        # A request after the abort: once it is done, the engine has dropped the aborted one.
        tokens, _ = generate(pb, decode, [1] + list(range(8000, 8010)), [])
        assert len(tokens) == 4
        assert snapshot_of(pb, decode.address).load.used_blocks == 3, "the blocks went back early"

        hanging.answer_cancel.set()
        wait_until(lambda: snapshot_of(pb, decode.address).load.used_blocks == 0,
                   what="the blocks to be released after Prefill.Cancel answered")
    finally:
        hanging.stop()
        decode.kill()


class KvPeer:
    """A kv_peer pool owner (tests/kvtransfer/kv_peer.cc) with the model's layout, every byte of
    its pool 0xA5; its replies are read on a thread."""

    def __init__(self, pb, ucx_tls):
        self.proc = subprocess.Popen(
            [str(BIN / "kv_peer"), "--role=owner", f"--name=owner-{ucx_tls}", f"--tls={ucx_tls}",
             "--layers=30", "--block_size=16", "--blocks=64", "--kv_heads=3", "--head_dim=64",
             "--canary=165"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        line = self.expect("DESCRIPTOR ")
        self.descriptor = pb.worker.KvPoolDescriptor.FromString(bytes.fromhex(line.split()[1]))

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def expect(self, prefix):
        while True:
            line = self.lines.get(timeout=WAIT_S)
            assert line is not None, "kv_peer exited"
            if line.startswith(prefix):
                return line

    def changed(self):
        self.proc.stdin.write("CHANGED\n")
        self.proc.stdin.flush()
        return self.expect("CHANGED ").split()[1]

    def quit(self):
        if self.proc.poll() is None:
            self.proc.stdin.write("QUIT\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=WAIT_S)


@pytest.mark.parametrize("ucx_tls", ["posix,self", "tcp,self"])
def test_a_prefill_worker_writes_only_a_valid_grant_over_ucx(pb, ucx_tls):
    owner = KvPeer(pb, ucx_tls)
    prefill = Process("tandem-prefill", *FLAGS, "--worker_id=p0", "--kv_dtype=f32",
                      f"--ucx_tls={ucx_tls}")
    try:
        stub = pb.worker_grpc.PrefillStub(grpc.insecure_channel(prefill.address))

        def prefill_into(block_ids, cached=0, pool=owner.descriptor):
            request = pb.worker.PrefillRequest(
                request_id=f"grant-{block_ids}", token_ids=[1] + list(range(6000, 6039)),
                num_destination_cached_tokens=cached,
                sampling=pb.inference.SamplingParams(temperature=0),
                destination=pb.worker.KvDestination(worker_id="owner", pool=pool,
                                                    block_ids=block_ids))
            return stub.Prefill(request, timeout=WAIT_S)

        other = pb.worker.KvPoolDescriptor()
        other.CopyFrom(owner.descriptor)
        other.layout.num_kv_heads, other.layout.head_dim = 64, 3  # same bytes, other shape
        for block_ids, cached, pool, code, says in [
            ([5, 64, 7], 0, owner.descriptor, grpc.StatusCode.INVALID_ARGUMENT,
             "destination.block_ids[1] = 64 is outside the pool's 64 blocks"),
            ([5, 7, 5], 0, owner.descriptor, grpc.StatusCode.INVALID_ARGUMENT,
             "destination.block_ids[2] = 5 repeats destination.block_ids[0]"),
            ([9, 9, 30], 16, owner.descriptor, grpc.StatusCode.INVALID_ARGUMENT, "repeats"),
            ([5, 7], 0, owner.descriptor, grpc.StatusCode.INVALID_ARGUMENT, "need exactly 3"),
            ([5, 7, 9], 0, other, grpc.StatusCode.FAILED_PRECONDITION, "KV layouts differ"),
        ]:
            with pytest.raises(grpc.RpcError) as refused:
                prefill_into(block_ids, cached, pool)
            assert refused.value.code() == code, refused.value.details()
            assert says in refused.value.details()
        assert owner.changed() == "-"  # every canary intact

        # Block 41 holds the first 16 tokens at the destination: only 9 and 30 are written.
        response = prefill_into([41, 9, 30], cached=16)
        assert response.timings.transfer_bytes == 2 * 30 * owner.descriptor.layout.block_bytes
        assert owner.changed() == "9,30"
    finally:
        prefill.kill()
        owner.quit()
