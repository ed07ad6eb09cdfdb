"""A local cluster started with `tandem up`, and the Prometheus counters of its workers.

`tandem up` prints the router's addresses on stdout ("OpenAI HTTP API: http://H:P/v1",
"gRPC API: H:P") and echoes every child's output on stderr, prefixed with "[name] ". A worker only
serves /metrics when it gets --metrics_listen, which `tandem up` does not pass; every flag can also
come from its TANDEM_* environment variable, so the cluster is started with
TANDEM_METRICS_LISTEN=127.0.0.1:0 and each worker's start-up line ("[decode-0] tandem-decode
decode-0 listening on port P (model M, metrics port N)") names its metrics port. (The router and
`tandem` itself log a warning that the variable matches none of their flags; that is harmless.)
"""
import os
import pathlib
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[2]

_HTTP_LINE = re.compile(r"OpenAI HTTP API:\s+(https?://\S+?)/v1\b")
_CA_LINE = re.compile(r"TLS CA:\s+(\S+)")
_GRPC_LINE = re.compile(r"gRPC API:\s+(\S+:\d+)")
_WORKERS_LINE = re.compile(r"^\s*workers:\s+(.+)$")
_WORKER_LINE = re.compile(r"^\[(?P<name>[^\]]+)\] .*listening on port \d+ .*metrics port (?P<port>-?\d+)"
                          r"(?P<https>, https)?")
_FLAG_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

PREFIX_HIT_METRIC = "tandem_worker_prefix_hit_tokens_total"
PROMPT_TOKENS_METRIC = "tandem_worker_prompt_tokens_total"
PREFILL_METRIC_PREFIX = "tandem_prefill_"


class ClusterError(RuntimeError):
    """The cluster could not be started or reached."""


def default_bin_dir():
    """TANDEM_BIN_DIR (set by `tandem bench`: the directory of the `tandem` that launched it),
    else <repo>/build/release/bin."""
    env = os.environ.get("TANDEM_BIN_DIR")
    return pathlib.Path(env) if env else REPO / "build" / "release" / "bin"


def parse_up_flags(text):
    """`tandem up` flags from "aggregated, decode_workers=2 policy=kv_aware" (commas or spaces;
    a leading -- is optional): ["--aggregated", "--decode_workers=2", "--policy=kv_aware"]."""
    flags = []
    for item in re.split(r"[,\s]+", text.strip()):
        if not item:
            continue
        name, sep, value = item.lstrip("-").partition("=")
        if not _FLAG_NAME.match(name):
            raise ValueError(f"'{item}' is not a `tandem up` flag (expected name or name=value)")
        if sep and not value:
            raise ValueError(f"'{item}': the flag has no value")
        flags.append(f"--{name}={value}" if sep else f"--{name}")
    return flags


def scrape(url, timeout_s=5.0, ca_file=None):
    """A Prometheus text page as {metric name: sum of its samples' values}; an https:// URL is
    checked against `ca_file` (the system's CAs without it)."""
    context = None
    if url.startswith("https://") and ca_file:
        import ssl
        context = ssl.create_default_context(cafile=ca_file)
    with urllib.request.urlopen(url, timeout=timeout_s, context=context) as response:
        text = response.read().decode("utf-8", "replace")
    totals = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, rest = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        try:
            value = float(rest)
        except ValueError:
            continue
        if name:
            totals[name] = totals.get(name, 0.0) + value
    return totals


class PrefixHitProbe:
    """Prefix-cache hits of a set of workers over an interval: their prefix_hit_tokens and
    prompt_tokens counters read before and after.

    In a disaggregated cluster every prompt is counted by its decode worker, and the part that
    the decode worker did not have cached is counted again by the prefill worker it hands it to;
    a token is a hit on one of them at most. So the overall rate is all workers' hits over the
    decode workers' prompt tokens: the share of prompt tokens that no worker computed. A prefill
    worker is told apart by its own metrics (tandem_prefill_*), which it exports once it has
    served a request (one that served none adds nothing to either sum)."""

    def __init__(self, metrics_urls, ca_file=None):
        self.urls = dict(metrics_urls)
        self.ca_file = ca_file  # verifies https:// URLs (workers with --metrics_tls)
        self._before = None

    def _read(self):
        out = {}
        for name, url in self.urls.items():
            try:
                values = scrape(url, ca_file=self.ca_file)
                prefill = any(k.startswith(PREFILL_METRIC_PREFIX) for k in values)
                out[name] = (values.get(PREFIX_HIT_METRIC, 0.0),
                             values.get(PROMPT_TOKENS_METRIC, 0.0), prefill)
            except (OSError, urllib.error.URLError):
                out[name] = None
        return out

    def start(self):
        self._before = self._read()

    def stop(self):
        """{"rate": all hits / decode workers' prompt tokens, "hit_tokens", "prompt_tokens" (the
        decode workers'), "workers": {name: {"role", "hit_tokens", "prompt_tokens", "rate"}}};
        rate is None when no worker could be read or none received a prompt."""
        after = self._read()
        workers = {}
        hits = prompts = 0.0
        for name, now in after.items():
            then = (self._before or {}).get(name)
            if now is None or then is None:
                workers[name] = None
                continue
            h, p, prefill = now[0] - then[0], now[1] - then[1], now[2]
            workers[name] = {"role": "prefill" if prefill else "decode", "hit_tokens": h,
                             "prompt_tokens": p, "rate": h / p if p else None}
            hits += h
            if not prefill:
                prompts += p
        return {"rate": hits / prompts if prompts else None, "hit_tokens": hits,
                "prompt_tokens": prompts, "workers": workers}


class LocalCluster:
    """`<bin_dir>/tandem up FLAGS` as a child process, on free ports; a context manager that
    waits until the cluster answers /health and stops it with SIGTERM on exit."""

    def __init__(self, bin_dir, flags, timeout_s=180.0, log_path=None):
        self.bin_dir = pathlib.Path(bin_dir)
        self.flags = list(flags)
        self.timeout_s = timeout_s
        self.log_path = log_path
        self.http_url = None      # http://host:port
        self.grpc_target = None   # host:port
        self.ca_file = None       # the CA of `tandem up --tls` (its "TLS CA:" line)
        self.worker_metrics = {}  # worker name -> http://127.0.0.1:N/metrics
        self._worker_count = None
        self._lines = []
        self._pumps = []          # the threads that read its stdout and stderr
        self._lock = threading.Lock()
        self._proc = None
        self._log_file = None

    def command(self):
        names = {f.lstrip("-").split("=", 1)[0] for f in self.flags}
        cmd = [str(self.bin_dir / "tandem"), "up", *self.flags]
        if "http_port" not in names:
            cmd.append("--http_port=0")
        if "grpc_port" not in names:
            cmd.append("--grpc_port=0")
        return cmd

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def log_tail(self, lines=40):
        with self._lock:
            return "".join(self._lines[-lines:])

    def _pump(self, stream):
        for line in stream:
            with self._lock:
                self._lines.append(line)
                if len(self._lines) > 5000:
                    del self._lines[:1000]
                if self._log_file is not None:
                    self._log_file.write(line)
            if self.http_url is None and (m := _HTTP_LINE.search(line)):
                self.http_url = m.group(1)
            if self.ca_file is None and (m := _CA_LINE.search(line)):
                self.ca_file = m.group(1)
            if self.grpc_target is None and (m := _GRPC_LINE.search(line)):
                self.grpc_target = m.group(1)
            if self._worker_count is None and (m := _WORKERS_LINE.match(line)):
                self._worker_count = len([a for a in m.group(1).split(",") if a.strip()])
            if (m := _WORKER_LINE.match(line)) and int(m.group("port")) > 0:
                scheme = "https" if m.group("https") else "http"
                self.worker_metrics[m.group("name")] = (
                    f"{scheme}://127.0.0.1:{m.group('port')}/metrics")

    def start(self):
        binary = self.bin_dir / "tandem"
        if not os.access(binary, os.X_OK):
            raise ClusterError(f"{binary} is missing or not executable: build the project or pass "
                               "--bin DIR (or set TANDEM_BIN_DIR)")
        env = dict(os.environ)
        env["TANDEM_METRICS_LISTEN"] = "127.0.0.1:0"
        if self.log_path:
            self._log_file = open(self.log_path, "a", encoding="utf-8")
            self._log_file.write(f"$ {' '.join(self.command())}\n")
        self._proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env,
                                      errors="replace")
        self._pumps = [threading.Thread(target=self._pump, args=(stream,), daemon=True)
                       for stream in (self._proc.stdout, self._proc.stderr)]
        for pump in self._pumps:
            pump.start()
        deadline = time.monotonic() + self.timeout_s
        try:
            while self.http_url is None or self.grpc_target is None or self._worker_count is None:
                if self._proc.poll() is not None:
                    raise ClusterError(f"`{' '.join(self.command())}` exited with status "
                                       f"{self._proc.returncode}:\n{self.log_tail()}")
                if time.monotonic() > deadline:
                    raise ClusterError(f"the cluster was not ready after {self.timeout_s:.0f} s:\n"
                                       f"{self.log_tail()}")
                time.sleep(0.05)
            while not self.healthy():
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    raise ClusterError(f"{self.http_url}/health did not answer 200:\n"
                                       f"{self.log_tail()}")
                time.sleep(0.1)
            # The workers' lines come through stderr, before the ready message on stdout; give
            # the reader a moment in case it lags.
            settle = time.monotonic() + 5.0
            while len(self.worker_metrics) < self._worker_count and time.monotonic() < settle:
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def healthy(self):
        context = None
        if self.ca_file:
            import ssl
            context = ssl.create_default_context(cafile=self.ca_file)
        try:
            with urllib.request.urlopen(self.http_url + "/health", timeout=2,
                                        context=context) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def stop(self):
        """SIGTERM, as an operator would; SIGKILL if it has not exited within 30 s."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        # What the process wrote last (its goodbye) is still in the pipes: read it all before the
        # log closes. A process that left children holding the pipes open gets 10 s.
        for pump in self._pumps:
            pump.join(timeout=10)
        if self._log_file is not None:
            with self._lock:
                self._log_file.close()
                self._log_file = None
