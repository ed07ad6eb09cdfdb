"""`tandem profile --worker=HOST:PORT` against real workers on loopback: the profile it writes
holds the worker's own settings (from its WatchState snapshot, read here with grpcio), the KV
bytes per token of the model (read here with PyPI gguf), and step coefficients that are the
non-negative least-squares fit of the steps the worker reports (the objective cost_model.h
documents): numpy's lstsq on the fit's support gives the same numbers, and the coefficients left
at 0 satisfy the optimality (KKT) condition.
Bad flags, a worker that does not answer and one with too few steps are clear errors."""
import json
import socket
import subprocess
import sys

import grpc
import numpy as np
import pytest
from gguf import GGUFReader

from cluster_common import BIN, ROOT, UCX, WORKER_FLAGS, Cluster, Process, Protos
from tls_test import OPENSSL, make_ca, make_leaf

sys.path.insert(0, str(ROOT / "bench"))
from tandem_bench import sim  # noqa: E402

TERMS = ("base_seconds", "prefill_token_seconds", "decode_token_seconds",
         "context_token_seconds", "prompt_context_token_seconds")


@pytest.fixture(scope="module")
def pb():
    return Protos()


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(prefill=1, decode=1, policy="slo", tag="prof-")
    yield c
    c.stop()


def profile(*flags, timeout=60):
    return subprocess.run([str(BIN / "tandem"), "profile", *flags], capture_output=True,
                          text=True, timeout=timeout)


def snapshot_of(pb, address):
    stub = pb.worker_grpc.WorkerStateStub(grpc.insecure_channel(address))
    stream = stub.WatchState(pb.worker.WatchStateRequest(subscriber="test", load_interval_ms=1000),
                             timeout=30)
    first = next(stream)
    stream.cancel()
    assert first.HasField("snapshot")
    return first.snapshot


def design(steps):
    """The step model's terms per step (router/placement/cost_model.h) and the durations."""
    x = np.array([[1.0, s.prefill_tokens, s.decode_tokens,
                   s.attended_tokens - s.prompt_attended_tokens, s.prompt_attended_tokens]
                  for s in steps])
    y = np.array([s.duration_us * 1e-6 for s in steps])
    return x, y


@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_captured_profile_is_the_fit_of_the_reported_steps(cluster, pb, tmp_path, role):
    worker = (cluster.decode if role == "decode" else cluster.prefill)[0]
    out = tmp_path / "p.json"
    result = profile(f"--worker={worker.address}", f"--out={out}")
    assert result.returncode == 0, result.stderr
    p = json.loads(out.read_text())
    sim.check_profile(p, "captured profile")  # what `tandem sim --profile` takes
    assert p["source"] == "measured" and f"from worker prof-{role[0]}0 " in p["notes"]
    # Exactly the keys of the format (the simulator refuses others).
    assert set(p) == {"format", "model", "engine", "source", "step", "kv_bytes_per_token",
                      "block_size", "kv_blocks", "max_running", "token_budget",
                      "max_prefill_tokens", "notes"}

    snap = snapshot_of(pb, worker.address)
    assert p["model"] == snap.model_id and p["engine"] == snap.engine
    assert (p["block_size"], p["kv_blocks"], p["max_running"], p["token_budget"]) == (
        snap.block_size, snap.total_blocks, snap.max_running, snap.max_tokens_per_step)
    reader = GGUFReader(str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))

    def meta(key):
        field = reader.fields[key]
        return int(field.parts[field.data[0]][0])

    head_dim = meta("llama.embedding_length") // meta("llama.attention.head_count")
    # K and V, every layer, f16 (the workers' default KV type). A prefill worker exports no KV
    # pool, so its profile cannot say.
    assert p["kv_bytes_per_token"] == (2 * meta("llama.block_count") *
                                       meta("llama.attention.head_count_kv") * head_dim * 2
                                       if role == "decode" else None)

    # Nothing was served: the snapshot still holds the start-up calibration's steps.
    steps = [s for s in snap.load.recent_steps if s.batch_size > 0]
    assert len(steps) >= 8 and f" from {len(steps)} steps: " in result.stdout, result.stdout
    x, y = design(steps)
    theta = np.array([p["step"][t] for t in TERMS])
    support = theta > 0
    assert support[0] and support.sum() >= 2, theta
    # The objective cost_model.h documents for a calibration fit: squared error on the terms
    # divided by their typical sizes, plus a 1e-6-weighted pull towards the default profile, over
    # coefficients >= 0. On the fit's support that is an ordinary least-squares problem (the pull
    # as extra rows), solved here by numpy.
    typical = np.array([1.0, 512, 32, 4096, 16384])
    prior = np.array([0.010, 0.0002, 0.0005, 1e-8, 1e-8]) * typical
    w = 1e-6
    xs = x / typical
    k = int(support.sum())
    a = np.vstack([xs[:, support], np.sqrt(w) * np.eye(k)])
    b = np.concatenate([y, np.sqrt(w) * prior[support]])
    ref, *_ = np.linalg.lstsq(a, b, rcond=None)
    np.testing.assert_allclose(theta[support], ref / typical[support], rtol=1e-6)
    # A coefficient held at 0 could not lower the objective by growing: its gradient is >= 0.
    phi = theta * typical
    gradient = xs.T @ (xs @ phi - y) + w * (phi - prior)
    tolerance = 1e-9 * np.linalg.norm(xs, axis=0) * np.linalg.norm(y)
    assert np.all(gradient[~support] >= -tolerance[~support]), (gradient, theta)
    print(f"{role}: {len(steps)} steps, {dict(zip(TERMS, theta))}")


def test_watching_adds_the_steps_of_served_requests(cluster, pb, tmp_path):
    """--watch_s fits the steps the worker reports while it serves: a request sent through the
    router during the watch adds its steps to the count."""
    worker = cluster.decode[0]
    out = tmp_path / "p.json"
    before = [s for s in snapshot_of(pb, worker.address).load.recent_steps if s.batch_size > 0]
    watcher = subprocess.Popen([str(BIN / "tandem"), "profile", f"--worker={worker.address}",
                                f"--out={out}", "--watch_s=3"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))
    request = pb.inference.GenerateRequest(
        prompt="the city of the world was " * 8,
        sampling=pb.inference.SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    answers = list(stub.Generate(request, timeout=60))
    assert answers[-1].usage.completion_tokens == 8
    stdout, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err
    steps = int(stdout.split(" from ")[1].split(" steps")[0])
    # The 8 tokens took at least 7 decode steps on this worker, all reported within the watch.
    assert steps >= len(before) + 7, stdout
    sim.check_profile(json.loads(out.read_text()), "watched profile")


def test_bad_flags_and_unreachable_workers_are_clear_errors(tmp_path):
    r = profile("--out=x.json")
    assert r.returncode == 2 and "--worker=HOST:PORT" in r.stderr, r.stderr
    r = profile("--worker=http://127.0.0.1:1", f"--out={tmp_path}/p.json")
    assert r.returncode == 2 and "--worker must be host:port" in r.stderr, r.stderr
    r = profile("--worker=127.0.0.1:1", f"--out={tmp_path}/p.json", "--watch_s=-1")
    assert r.returncode == 2 and "--watch_s" in r.stderr, r.stderr
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    r = profile(f"--worker=127.0.0.1:{free}", f"--out={tmp_path}/p.json")
    assert r.returncode == 1 and f"no worker state from 127.0.0.1:{free}" in r.stderr, r.stderr
    assert not (tmp_path / "p.json").exists()


def test_a_worker_without_calibration_has_too_few_steps(tmp_path):
    worker = Process("tandem-decode", *WORKER_FLAGS, "--worker_id=nocal", "--calibrate=false",
                     env=UCX)
    try:
        r = profile(f"--worker={worker.address}", f"--out={tmp_path}/p.json")
    finally:
        worker.kill()
    assert r.returncode == 1 and "reports 0 engine steps; a profile needs at least 8" in r.stderr, \
        r.stderr
    assert not (tmp_path / "p.json").exists()


def test_roofline_is_handed_to_python(tmp_path):
    r = profile("--roofline", "--gpu=h100", "--params=1e9", "--layers=16", "--hidden=2048",
                "--kv_heads=4", "--head_dim=64", f"--out={tmp_path}/p.json")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "p.json").read_text())["source"] == "roofline"


def test_capture_over_mutual_tls(tmp_path):
    """A worker that takes only clients with a certificate of its CA (`openssl`-made): the TLS
    flags every client has get the profile; a plaintext capture gets a clear error."""
    assert OPENSSL, "the openssl command is needed (scripts/setup.sh installs it)"
    make_ca(tmp_path, "cluster")
    cert, key = make_leaf(tmp_path, "cluster", "worker")
    client_cert, client_key = make_leaf(tmp_path, "cluster", "client")
    ca = tmp_path / "cluster-ca.crt"
    worker = Process("tandem-decode", *WORKER_FLAGS, "--worker_id=tls", f"--tls_cert={cert}",
                     f"--tls_key={key}", f"--tls_ca={ca}", env=UCX)
    try:
        r = profile(f"--worker={worker.address}", f"--out={tmp_path}/p.json", f"--tls_ca={ca}",
                    f"--tls_cert={client_cert}", f"--tls_key={client_key}")
        assert r.returncode == 0, r.stderr
        sim.check_profile(json.loads((tmp_path / "p.json").read_text()), "profile over TLS")
        r = profile(f"--worker={worker.address}", f"--out={tmp_path}/q.json")
        assert r.returncode == 1 and f"no worker state from {worker.address}" in r.stderr, r.stderr
    finally:
        worker.kill()
