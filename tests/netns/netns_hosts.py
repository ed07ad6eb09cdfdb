"""Hosts for multi-host tests, made of Linux network namespaces on one machine.

    with Network(["router", "prefill", "decode"]) as net:
        decode = net["decode"]
        worker = decode.run([BIN / "tandem-decode", f"--listen={decode.ip}:0", ...],
                            env={"UCX_TLS": "tcp"})
        port = net["router"].forward(router_port)      # 127.0.0.1:port reaches the router
        net.cut(decode)                                # a partition: processes stay alive
        net.restore(decode)

Layout: a "switch" namespace holds a Linux bridge; every host is a namespace of its own joined to
the bridge by a veth pair (`eth0` inside the host, `p<pid>h<i>` on the bridge), with one IPv4
address of a /24 (10.213.<pid % 250 + 1>.0/24, .2 up), `lo` up and IPv6 off. Nothing is created
in the root namespace but the namespaces themselves (named tdmnet<pid>-<host>, tdmnet<pid>-switch),
so the machine's own network is never touched and interface names cannot clash between runs (each
lives in a namespace of this run). The root namespace cannot reach the hosts either:
`Host.connect`, `Host.http_get` and `Host.forward` open their sockets inside a host's namespace.
Processes started in a host die with the thread that started them (PR_SET_PDEATHSIG).

Faults:
  cut / restore            the host's bridge port down / up: its packets are dropped silently
                           both ways (no RST, no ICMP), like a pulled cable or a dead switch port.
  cut_between / restore_between
                           only packets between two hosts dropped (tc u32 filters on both hosts'
                           egress into a drop class); each keeps its other links.
  shape / unshape          a degraded link: netem delay and loss where the kernel has sch_netem;
                           without it, a rate limit (htb) and random loss (a classic-BPF filter
                           that sends a random share of packets to a class that drops them).
                           `netem_available()` says which this kernel allows.

Teardown: `close()` (the context manager, atexit, and SIGTERM, turned into KeyboardInterrupt so
that pytest unwinds) kills every process in the namespaces and deletes them. Namespaces of an
earlier run of this harness that died (SIGKILL) are deleted when the next one starts; only names
with this harness's prefix whose process no longer exists.

Not thread-safe: one thread builds, faults and closes a Network (the processes' output pumps and
the forwarders run on threads of their own). Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and `ip`
and `tc` (iproute2); `unavailable_reason()` says why not, for a skip."""
import atexit
import ctypes
import http.client
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import threading
import time

from cluster_common import ProcessControl  # tests/cluster (conftest.py puts it on sys.path)

PREFIX = "tdmnet"  # every namespace this harness makes is named PREFIX<pid>-<name>
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _run(*argv, check=True):
    """Runs a command; raises with its output when `check` and it fails."""
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed ({result.returncode}): "
                           f"{result.stderr.strip() or result.stdout.strip()}")
    return result


def _die_with_parent():
    """preexec_fn: the child is SIGKILLed when the thread that started it ends (so a test killed
    with SIGKILL leaves no server behind); kept across exec of `ip netns exec`."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_unavailable = None


def unavailable_reason():
    """None when this machine lets the test make network namespaces, bridges and veth pairs;
    else why not (for pytest.skip). Probed once."""
    global _unavailable
    if _unavailable is None:
        _unavailable = _probe() or ""
    return _unavailable or None


def _probe():
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' (iproute2) is not installed"
    name = f"{PREFIX}{os.getpid()}-probe"
    made = _run("ip", "netns", "add", name, check=False)
    if made.returncode != 0:
        return f"'ip netns add' failed: {made.stderr.strip()}"
    try:
        for argv in (["ip", "-n", name, "link", "add", "probebr", "type", "bridge"],
                     ["ip", "-n", name, "link", "add", "probea", "type", "veth", "peer", "name",
                      "probeb"],
                     ["ip", "-n", name, "link", "set", "lo", "up"]):
            result = _run(*argv, check=False)
            if result.returncode != 0:
                return f"'{' '.join(argv)}' failed: {result.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", name, check=False)
    return None


_netem = None


def netem_available():
    """Whether the kernel has the netem qdisc (delay, loss). Tried once, in a scratch namespace:
    a kernel without sch_netem answers "Specified qdisc kind is unknown"."""
    global _netem
    if _netem is None:
        name = f"{PREFIX}{os.getpid()}-netem"
        _run("ip", "netns", "add", name)
        try:
            result = _run("tc", "-n", name, "qdisc", "add", "dev", "lo", "root", "netem",
                          "delay", "1ms", check=False)
            _netem = result.returncode == 0
        finally:
            _run("ip", "netns", "del", name, check=False)
    return _netem


def _pids_in(netns):
    result = _run("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []


def _delete_namespace(netns):
    """Kills what still runs in `netns`, waits for each process to exit (on a pidfd, which becomes
    readable when it does; bounded), then deletes the namespace."""
    for _ in range(10):
        fds = []
        for pid in _pids_in(netns):
            try:
                fds.append(os.pidfd_open(pid))
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not fds:
            break
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        pending = set(fds)
        deadline = time.monotonic() + 5
        while pending and time.monotonic() < deadline:
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            for fd, _ in poller.poll(left_ms):
                pending.discard(fd)
                poller.unregister(fd)
        for fd in fds:
            os.close(fd)
    _run("ip", "netns", "del", netns, check=False)


def remove_stale_namespaces():
    """Deletes the namespaces of earlier runs of this harness whose process is gone; returns
    their names. Names of any other prefix, and those of runs still alive, are left alone."""
    listing = _run("ip", "netns", "list", check=False).stdout
    removed = []
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        match = re.fullmatch(rf"{PREFIX}(\d+)-[\w.-]+", name)
        if match is None:
            continue
        pid = int(match.group(1))
        try:
            os.kill(pid, 0)
            continue  # that run is still alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _delete_namespace(name)
        removed.append(name)
    return removed


class HostProcess(ProcessControl):
    """A process started inside a host's namespace (`ip netns exec`, which execs it: `proc.pid` is
    the program's own). Its stdout and stderr lines are kept in `log`. When `ready` (a regular
    expression) is given, `wait_ready` waits for a line matching it; its first group, when it has
    one, is the port (`port`). Tandem binaries print "listening on port N": `TANDEM_READY`.
    Like cluster_common.Process, for a binary that runs in a namespace."""

    def __init__(self, host, argv, env=None, ready=None):
        self.host = host
        self.argv = [str(a) for a in argv]
        self.name = os.path.basename(self.argv[0])
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.log = []
        self.port = None
        self.ready = False  # the ready line came
        self._ready_pattern = re.compile(ready) if ready else None
        self._ready = threading.Event()
        self._lines = threading.Condition()  # notified at each line and at the end of output
        self._ended = False
        self.proc = subprocess.Popen(["ip", "netns", "exec", host.netns, *self.argv],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, errors="replace",
                                     env=full_env, preexec_fn=_die_with_parent)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            with self._lines:
                self.log.append(line)
                self._lines.notify_all()
            if self._ready_pattern is not None and not self._ready.is_set():
                match = self._ready_pattern.search(line)
                if match:
                    if match.groups():
                        self.port = int(match.group(1))
                    self.ready = True
                    self._ready.set()
        self._ready.set()  # exited: wait_ready stops waiting
        with self._lines:
            self._ended = True
            self._lines.notify_all()

    def wait_line(self, pattern, timeout=180):
        """The first match of `pattern` in the log, waiting for a line that has it (woken by each
        line the process writes); raises with the log when the process exits or the time runs
        out first."""
        regex = re.compile(pattern)
        match = None

        def found():
            nonlocal match
            match = next((m for m in map(regex.search, self.log) if m), None)
            return match is not None or self._ended

        with self._lines:
            self._lines.wait_for(found, timeout)
        if match is None:
            why = "exited" if self._ended else f"did not in {timeout:.0f} s"
            raise AssertionError(f"{self.name} in {self.host.name} {why} before a line matching "
                                 f"{pattern!r}:\n{''.join(self.log[-60:])}")
        return match

    def wait_ready(self, timeout=180):
        """Waits for the ready line; raises with the log when the process exits or the time runs
        out first. Returns self."""
        self._ready.wait(timeout)
        if not self.ready:
            self.kill()
            why = "exited before it was ready" if self._ready.is_set() else \
                f"did not start in {timeout} s"
            raise AssertionError(f"{self.name} in {self.host.name} {why}:\n"
                                 f"{''.join(self.log[-60:])}")
        return self

    @property
    def address(self):
        return f"{self.host.ip}:{self.port}"

    def find(self, pattern):
        """The first match of `pattern` in the log, or None."""
        for line in list(self.log):
            match = re.search(pattern, line)
            if match:
                return match
        return None

    def alive(self):
        return self.proc.poll() is None


TANDEM_READY = r"listening on port (\d+)"


class Forwarder:
    """Accepts on 127.0.0.1:<port> in the root namespace and relays each connection to
    `target` opened inside a host's namespace. Bytes are relayed as they come, both ways, with
    half-closes passed on. close() ends every connection."""

    def __init__(self, host, target):
        self.host, self.target = host, target
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._sockets = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = self.host.connect(*self.target, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._sockets.update((client, upstream))
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._relay, args=(client, upstream), daemon=True).start()

    def _relay(self, a, b):
        open_reads = {a: b, b: a}
        try:
            while open_reads:
                readable, _, _ = select.select(list(open_reads), [], [], 1.0)
                for source in readable:
                    data = source.recv(65536)
                    sink = open_reads[source]
                    if data:
                        sink.sendall(data)
                    else:
                        del open_reads[source]
                        sink.shutdown(socket.SHUT_WR)
                if self._closed:
                    return
        except OSError:
            pass
        finally:
            with self._lock:
                self._sockets.difference_update((a, b))
            for sock in (a, b):
                sock.close()

    def close(self):
        with self._lock:
            self._closed = True
            sockets = list(self._sockets)
        self._listener.close()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def get_text(conn, path, headers=None):
    """(status, body text) of GET `path` over `conn`, which is closed after; (0, error) when it
    fails."""
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as error:
        return 0, str(error)
    finally:
        conn.close()


class Host:
    """One host: a network namespace with `eth0` on the network's bridge and address `ip`.
    Made by Network; valid until it closes."""

    def __init__(self, network, index, name):
        self.network = network
        self.index = index
        self.name = name
        self.netns = f"{network.prefix}-{name}"
        self.ip = f"{network.subnet}.{index + 2}"
        self.port_name = f"p{os.getpid()}h{index}"  # its end on the bridge, in the switch ns
        self.processes = []
        self.forwarders = []

    def __repr__(self):
        return f"Host({self.name}, {self.ip})"

    def run(self, argv, env=None, ready=TANDEM_READY, timeout=180, wait=True):
        """Starts `argv` in this host's namespace (`env` added to the test's environment). With
        `wait`, waits until its output matches `ready` (see HostProcess)."""
        process = HostProcess(self, argv, env=env, ready=ready)
        self.processes.append(process)
        if wait and ready:
            process.wait_ready(timeout)
        return process

    def exec(self, *argv, check=True):
        """Runs a short command in the namespace; its CompletedProcess."""
        return _run("ip", "netns", "exec", self.netns, *argv, check=check)

    def within(self, fn):
        """fn() run on a thread that entered this host's network namespace; its result. Sockets
        fn makes belong to the namespace for good."""
        box = {}

        def target():
            try:
                fd = os.open(f"/run/netns/{self.netns}", os.O_RDONLY)
                try:
                    if _libc.setns(fd, _CLONE_NEWNET) != 0:
                        error = ctypes.get_errno()
                        raise OSError(error, f"setns({self.netns}): {os.strerror(error)}")
                finally:
                    os.close(fd)
                box["value"] = fn()
            except BaseException as error:  # handed to the caller
                box["error"] = error

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def connect(self, ip, port, timeout=10):
        """A TCP socket connected from inside this host to ip:port."""
        return self.within(lambda: socket.create_connection((ip, port), timeout=timeout))

    def forward(self, port, ip=None):
        """A port on 127.0.0.1 in the root namespace whose connections reach ip:port (default:
        this host's own address) from inside this host, so that ordinary clients (grpc,
        http.client) in the test process can talk to a server here."""
        forwarder = Forwarder(self, (ip or self.ip, port))
        self.forwarders.append(forwarder)
        return forwarder.port

    def http_get(self, port, path, ip=None, timeout=5):
        """(status, body text) of GET http://ip:port/path made from inside this host (default: its
        own address, which a cut of its link does not reach); (0, error) when it fails."""
        try:
            sock = self.connect(ip or self.ip, port, timeout=timeout)
        except OSError as error:
            return 0, str(error)
        conn = http.client.HTTPConnection(ip or self.ip, port, timeout=timeout)
        conn.sock = sock
        return get_text(conn, path)

    def _close(self):
        for forwarder in self.forwarders:
            forwarder.close()
        for process in self.processes:
            process.kill()


class Network:
    """Hosts on one switch; see the module comment. Use as a context manager (or call close()).

    REQUIRES: unavailable_reason() is None."""

    def __init__(self, names, subnet=None):
        assert len(set(names)) == len(names) and len(names) <= 200, names
        self.prefix = f"{PREFIX}{os.getpid()}"
        # The addresses exist only inside this network's namespaces, so they cannot clash with
        # the machine's; a subnet derived from the pid keeps logs of concurrent runs apart.
        self.subnet = subnet or f"10.213.{os.getpid() % 250 + 1}"
        self.switch = f"{self.prefix}-switch"
        self.hosts = [Host(self, i, name) for i, name in enumerate(names)]
        self._by_name = {h.name: h for h in self.hosts}
        self._blocked = {h.name: set() for h in self.hosts}  # host -> peer addresses dropped
        self._shaping = {}  # host name -> dict(delay_ms, loss_pct, rate_mbit)
        self._closed = False
        self._namespaces = []
        self._previous_sigterm = None
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(f"network namespaces are not available: {reason}")
        remove_stale_namespaces()
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGTERM)
            if previous in (signal.SIG_DFL, None):
                self._previous_sigterm = previous
                signal.signal(signal.SIGTERM, _interrupt)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self):
        self._add_namespace(self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge", "forward_delay", "0")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        _run("ip", "-n", self.switch, "link", "set", "lo", "up")
        for h in self.hosts:
            self._add_namespace(h.netns)
            # Made in the switch namespace with its peer straight in the host's: neither end
            # ever exists in the root namespace.
            _run("ip", "-n", self.switch, "link", "add", h.port_name, "type", "veth", "peer",
                 "name", "eth0", "netns", h.netns)
            _run("ip", "-n", self.switch, "link", "set", h.port_name, "master", "br0")
            _run("ip", "-n", self.switch, "link", "set", h.port_name, "up")
            h.exec("sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; "
                               "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6", check=False)
            _run("ip", "-n", h.netns, "addr", "add", f"{h.ip}/24", "dev", "eth0")
            _run("ip", "-n", h.netns, "link", "set", "eth0", "up")
            _run("ip", "-n", h.netns, "link", "set", "lo", "up")

    def _add_namespace(self, name):
        _run("ip", "netns", "add", name)
        self._namespaces.append(name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getitem__(self, name):
        return self._by_name[name]

    def _host(self, host):
        return host if isinstance(host, Host) else self._by_name[host]

    def close(self):
        """Kills every process in the hosts and deletes every namespace. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for h in self.hosts:
            h._close()
        for name in reversed(self._namespaces):
            _delete_namespace(name)
        self._namespaces = []
        if self._previous_sigterm is not None and \
                threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
        atexit.unregister(self.close)

    def leftovers(self):
        """Namespaces of this network that still exist (none after close())."""
        listing = _run("ip", "netns", "list", check=False).stdout
        return [l.split()[0] for l in listing.splitlines()
                if l.split() and l.split()[0].startswith(self.prefix + "-")]

    # -- faults ---------------------------------------------------------------------------------

    def cut(self, host):
        """Partitions `host` from every other: its bridge port goes down, so packets either way
        are dropped without a word; its processes keep running and its own address answers
        inside it."""
        _run("ip", "-n", self.switch, "link", "set", self._host(host).port_name, "down")

    def restore(self, host):
        """Undoes cut()."""
        _run("ip", "-n", self.switch, "link", "set", self._host(host).port_name, "up")

    def cut_between(self, a, b):
        """Drops every IP packet between hosts a and b (both directions, at each one's egress);
        their links to other hosts stay up."""
        a, b = self._host(a), self._host(b)
        self._blocked[a.name].add(b.ip)
        self._blocked[b.name].add(a.ip)
        self._apply(a)
        self._apply(b)

    def restore_between(self, a, b):
        a, b = self._host(a), self._host(b)
        self._blocked[a.name].discard(b.ip)
        self._blocked[b.name].discard(a.ip)
        self._apply(a)
        self._apply(b)

    def shape(self, host, delay_ms=0, loss_pct=0.0, rate_mbit=None):
        """Degrades `host`'s link, both directions: each packet `delay_ms` late and `loss_pct` %
        of them lost (netem: ValueError when delay_ms is asked for and the kernel lacks
        sch_netem), at most `rate_mbit` Mbit/s (htb). Without netem, loss is a classic-BPF filter
        that sends that share of packets at random to a class that drops them. Returns what was
        set up, in words."""
        host = self._host(host)
        if delay_ms and not netem_available():
            raise ValueError("a delay needs the netem qdisc, which this kernel lacks "
                             "(sch_netem: 'Specified qdisc kind is unknown')")
        self._shaping[host.name] = {"delay_ms": delay_ms, "loss_pct": loss_pct,
                                    "rate_mbit": rate_mbit}
        self._apply(host)
        return self.describe_shaping(host)

    def unshape(self, host):
        host = self._host(host)
        self._shaping.pop(host.name, None)
        self._apply(host)

    def describe_shaping(self, host):
        s = self._shaping.get(self._host(host).name)
        if not s:
            return "none"
        parts = []
        if s["rate_mbit"]:
            parts.append(f"htb rate {s['rate_mbit']} Mbit/s")
        if s["delay_ms"]:
            parts.append(f"netem delay {s['delay_ms']} ms")
        if s["loss_pct"]:
            how = "netem" if netem_available() else "random drops by a classic-BPF tc filter"
            parts.append(f"{s['loss_pct']}% loss ({how})")
        return ", ".join(parts) or "none"

    def _apply(self, host):
        """Rebuilds the qdisc trees of `host`'s link from its blocked peers and its shaping:
        host side (eth0, egress from the host) and switch side (its bridge port, egress to it)."""
        shaping = self._shaping.get(host.name)
        self._tree(["-n", host.netns], "eth0", self._blocked[host.name], shaping)
        self._tree(["-n", self.switch], host.port_name, (), shaping)

    @staticmethod
    def _tree(ns, dev, blocked, shaping):
        tc = ["tc", *ns]
        _run(*tc, "qdisc", "del", "dev", dev, "root", check=False)
        if not blocked and not shaping:
            return
        rate = f"{shaping['rate_mbit']}mbit" if shaping and shaping["rate_mbit"] else "10gbit"
        # 1: htb; 1:10 every packet by default (shaped); 1:99 a sink: its pfifo holds nothing,
        # so every packet classified there is dropped.
        _run(*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
        _run(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb",
             "rate", rate, "ceil", rate, "quantum", "1514")
        _run(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:99", "htb",
             "rate", "8kbit", "quantum", "1514")
        _run(*tc, "qdisc", "add", "dev", dev, "parent", "1:99", "handle", "99:", "pfifo",
             "limit", "0")
        for ip in sorted(blocked):
            _run(*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1",
                 "u32", "match", "ip", "dst", f"{ip}/32", "flowid", "1:99")
        if not shaping:
            return
        delay, loss = shaping["delay_ms"], shaping["loss_pct"]
        if netem_available() and (delay or loss):
            netem = ["netem", "limit", "10000"]
            if delay:
                netem += ["delay", f"{delay}ms"]
            if loss:
                netem += ["loss", f"{loss}%"]
            _run(*tc, "qdisc", "add", "dev", dev, "parent", "1:10", "handle", "10:", *netem)
        elif loss:
            _run(*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "all", "prio", "2",
                 "bpf", "bytecode", _random_drop_bytecode(loss / 100.0))


def _random_drop_bytecode(share):
    """cBPF for cls_bpf: classid 1:99 (dropped) for `share` of packets at random, else 0 (no
    match: htb's default class).
        ld  #rand           ; A = prandom_u32()   (ancillary load SKF_AD_OFF + SKF_AD_RANDOM)
        jgt #threshold, 0, 1
        ret #0x10099        ; 1:99
        ret #0              ; no match"""
    assert 0 < share < 1, share
    threshold = int((1 - share) * 2**32) - 1
    ld_rand = (0x20, 0, 0, (2**32 - 0x1000 + 56))  # BPF_LD|BPF_W|BPF_ABS, k = SKF_AD_OFF + 56
    jgt = (0x25, 0, 1, threshold)                   # BPF_JMP|BPF_JGT|BPF_K
    drop = (0x06, 0, 0, 0x10099)                    # BPF_RET|BPF_K
    keep = (0x06, 0, 0, 0)
    program = [ld_rand, jgt, drop, keep]
    return f"{len(program)}," + ",".join(" ".join(map(str, op)) for op in program)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
