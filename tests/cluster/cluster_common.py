"""What the cluster tests share: Python stubs generated from the repo's protos, and worker
processes started on loopback, waited for, and killed."""
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


class Process:
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


def wait_until(predicate, timeout=20, interval=0.05, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")
