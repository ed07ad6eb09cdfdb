"""What the cluster tests share: Python stubs generated from the repo's protos, worker processes
started on loopback, waited for, and killed, a router in front of them (Cluster), HTTP helpers,
a Generate call read on a thread (GenerateStream) and a raw gRPC health check."""
import http.client
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import grpc

ROOT = pathlib.Path(os.environ.get("TANDEM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BIN = pathlib.Path(os.environ["TANDEM_BIN_DIR"])


sys.path.insert(0, str(ROOT / "tests" / "proto_interop"))
from generated_protos import GeneratedProtos  # noqa: E402


def Protos():
    """tandem.v1 modules generated at test time with grpcio-tools."""
    return GeneratedProtos(ROOT / "proto")


class ProcessControl:
    """Stopping a started process (`self.proc`, a subprocess.Popen)."""

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stop(self):
        """SIGTERM, as an operator would; returns the exit status."""
        self.kill(signal.SIGTERM)
        return self.proc.returncode


class Process(ProcessControl):
    """A Tandem binary started with flags; `port` is read from its "listening on port N" line."""

    def __init__(self, binary, *flags, env=None, timeout=60):
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.log = []
        self.proc = subprocess.Popen([str(BIN / binary), *flags], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=full_env)
        self.port = None
        ready = threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.log.append(line)
                if self.port is None and "listening on port " in line:
                    self.port = int(line.split("listening on port ")[1].split()[0])
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout) or self.port is None:
            self.kill()
            raise AssertionError(f"{binary} did not start:\n{''.join(self.log)}")

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"


def wait_until(predicate, timeout=20, interval=0.05, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def wait_router_ready(router, workers, health_status, timeout=120):
    """Waits until `workers` workers joined the router's registry (their WatchState streams are
    up: a line of its log each) and health_status() (of its GET /health) is 200."""
    wait_until(lambda: sum(" joined (" in l for l in router.log) >= workers, timeout=timeout,
               what="every worker to join the router")
    wait_until(lambda: health_status() == 200, timeout=60, what="GET /health to answer 200")


def http_request(port, method, path, body=None, headers=None, timeout=60):
    """(status, parsed JSON or raw text) of one HTTP request; `body` is a dict (sent as JSON),
    bytes or None."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        conn.request(method, path, body=data,
                     headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        raw = response.read().decode("utf-8", "replace")
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, raw
    finally:
        conn.close()


def http_get(port, path):
    try:
        return http_request(port, "GET", path, timeout=5)
    except OSError as error:
        return 0, str(error)


class OnThread:
    """A call made on a thread by start(*args), which runs the subclass's _read(*args); that sets
    `flowing` once enough came. However the call ends, `ended_at` (time.monotonic) is then set, and
    `flowing` too. join() waits for the end and fails if it does not come (`what` names the call
    there)."""

    what = "the stream"

    def start(self, *args):
        self.ended_at = None
        self.flowing = threading.Event()
        self.thread = threading.Thread(target=self._run, args=args, daemon=True)
        self.thread.start()

    def _run(self, *args):
        try:
            self._read(*args)
        finally:
            self.ended_at = time.monotonic()
            self.flowing.set()

    def join(self, timeout=300):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.what} never ended"
        return self


class GenerateStream(OnThread):
    """One Generate call of `stub` read on a thread: its tokens and text, the last response (the
    one with a finish_reason), the grpc.RpcError if it failed, and when (time.monotonic) it
    started and ended. `flowing` is set once `flowing_after` tokens came, or at the end."""

    def __init__(self, stub, request, flowing_after=4):
        self.request = request
        self.tokens, self.text, self.last, self.error = [], "", None, None
        self.started_at = time.monotonic()
        self._flowing_after = flowing_after
        self.start(stub)

    def _read(self, stub):
        try:
            for response in stub.Generate(self.request, timeout=300):
                self.tokens.extend(response.token_ids)
                self.text += response.text
                if len(self.tokens) >= self._flowing_after:
                    self.flowing.set()
                if response.finish_reason:
                    self.last = response
        except grpc.RpcError as error:
            self.error = error

    def join(self, timeout=300, ok=False):
        """Waits for the end; with `ok`, the call must also have succeeded."""
        super().join(timeout)
        assert not ok or self.error is None, self.describe()
        return self

    def describe(self):
        if self.error is not None:
            return f"{self.error.code()}: {self.error.details()}"
        return f"{len(self.tokens)} tokens, {self.last and self.last.timings}"


def greedy_request(pb, prompt, max_tokens):
    """A GenerateRequest of exactly `max_tokens` greedy tokens."""
    return pb.inference.GenerateRequest(
        prompt=prompt, sampling=pb.inference.SamplingParams(max_tokens=max_tokens, temperature=0,
                                                            ignore_eos=True))


def grpc_health(address, timeout=5):
    """grpc.health.v1 Check of the whole server, read by hand (one varint field): 1 SERVING,
    2 NOT_SERVING, None when the call failed (the server is gone)."""
    with grpc.insecure_channel(address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        try:
            answer = check(b"", timeout=timeout)
        except grpc.RpcError:
            return None
    return answer[1] if len(answer) == 2 and answer[0] == 0x08 else -1


class WorkerPools:
    """A cluster's `prefill` and `decode` lists; `workers` is both."""

    @property
    def workers(self):
        return self.prefill + self.decode


UCX = {"UCX_TLS": "posix,self"}
WORKER_FLAGS = ["--listen=127.0.0.1:0", "--kv_cache_mb=64", "--threads=1"]


class Cluster(WorkerPools):
    """`prefill` + `decode` workers and a router in front of them; stop() kills every process."""

    def __init__(self, prefill=2, decode=2, policy="kv_aware", tag="", router_flags=()):
        self.prefill, self.decode, self.router = [], [], None
        try:
            for i in range(prefill):
                self.prefill.append(Process("tandem-prefill", *WORKER_FLAGS,
                                            f"--worker_id={tag}p{i}", env=UCX))
            for i in range(decode):
                self.decode.append(Process("tandem-decode", *WORKER_FLAGS,
                                           f"--worker_id={tag}d{i}", env=UCX))
            addresses = ",".join(w.address for w in self.workers)
            self.router = Process("tandem-router", "--listen=127.0.0.1:0",
                                  "--http_listen=127.0.0.1:0", f"--workers={addresses}",
                                  f"--policy={policy}", "--local_prefill_threshold=16",
                                  *router_flags)
            line = next(l for l in self.router.log if "listening on port " in l)
            self.http_port = int(line.split("(http port ")[1].split(",")[0])
            assert self.http_port > 0, line
            wait_router_ready(self.router, len(self.workers),
                              lambda: http_get(self.http_port, "/health")[0])
        except BaseException:
            self.stop()
            raise

    @property
    def grpc_address(self):
        return self.router.address

    def restart_router(self):
        """SIGKILLs the router and starts it again with the same flags; returns the seconds from
        the new process's start until it answers GET /health with 200 (it has rebuilt its view
        from the workers' WatchState snapshots)."""
        args = self.router.proc.args
        self.router.kill()
        start = time.monotonic()
        self.router = Process(pathlib.Path(args[0]).name, *args[1:])
        line = next(l for l in self.router.log if "listening on port " in l)
        self.http_port = int(line.split("(http port ")[1].split(",")[0])
        try:
            wait_until(lambda: http_get(self.http_port, "/health")[0] == 200, timeout=60,
                       interval=0.01, what="the restarted router to answer GET /health")
        except AssertionError as error:
            raise AssertionError(f"{error}; its log:\n{self.logs()}") from None
        return time.monotonic() - start

    def stop(self):
        for p in ([self.router] if self.router else []) + self.workers:
            p.kill()

    def logs(self):
        return "".join(self.router.log[-40:]) if self.router else ""
