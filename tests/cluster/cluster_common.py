"""What the cluster tests share: Python stubs generated from the repo's protos, worker processes
started on loopback, waited for, and killed, a router in front of them (Cluster), and HTTP
helpers."""
import http.client
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

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


UCX = {"UCX_TLS": "posix,self"}
WORKER_FLAGS = ["--listen=127.0.0.1:0", "--kv_cache_mb=64", "--threads=1"]


class Cluster:
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
    def workers(self):
        return self.prefill + self.decode

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
