"""The namespace harness itself (netns_hosts.py), with plain processes and sockets: hosts reach
each other and nothing else, a cut partitions a host without resetting its connections and a
restore resumes them, cut_between drops one pair only, shaping limits the rate and drops the
asked share of packets, and teardown leaves no namespace, link or process behind."""
import os
import socket
import subprocess
import sys
import time

import pytest

import netns_hosts  # beside this file (conftest.py puts it on sys.path)
from netns_hosts import Network, PREFIX

# A TCP echo server: prints its port, echoes every connection until it closes.
ECHO_SERVER = r"""
import socket, sys, threading
listener = socket.socket()
listener.bind((sys.argv[1], 0))
listener.listen(16)
print("echo listening on port", listener.getsockname()[1], flush=True)
def serve(c):
    while True:
        data = c.recv(65536)
        if not data:
            c.close()
            return
        c.sendall(data)
while True:
    c, _ = listener.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


@pytest.fixture(autouse=True)
def namespaces_allowed():
    reason = netns_hosts.unavailable_reason()
    if reason:
        pytest.skip(f"network namespaces unavailable: {reason}")


def root_links():
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


def our_namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [l.split()[0] for l in out.splitlines() if l.startswith(PREFIX)]


def echo_server(host):
    return host.run([sys.executable, "-u", "-c", ECHO_SERVER, host.ip], env={},
                    ready=r"listening on port (\d+)", timeout=30)


def roundtrip(sock, payload=b"ping", timeout=5.0):
    """The echo of `payload`, or None when it did not come back within `timeout`."""
    sock.settimeout(timeout)
    sock.sendall(payload)
    got = b""
    try:
        while len(got) < len(payload):
            chunk = sock.recv(65536)
            if not chunk:
                return None
            got += chunk
    except socket.timeout:
        return None
    return got


def test_hosts_reach_each_other_and_teardown_leaves_nothing():
    links_before = root_links()
    with Network(["a", "b", "c"]) as net:
        assert sorted(our_namespaces()) == sorted(net.leftovers())
        assert len(net.leftovers()) == 4  # a switch and three hosts
        assert root_links() == links_before, "the harness created a link in the root namespace"
        server = echo_server(net["b"])
        for client in ("a", "c", "b"):
            with net[client].connect(net["b"].ip, server.port) as sock:
                assert roundtrip(sock) == b"ping", client
        # Through a forwarder, from the root namespace.
        with socket.create_connection(("127.0.0.1", net["b"].forward(server.port)), 5) as sock:
            assert roundtrip(sock, b"x" * 100000) == b"x" * 100000
        # The root namespace has no route to the hosts' subnet (the echo server is not reachable).
        with pytest.raises(OSError):
            socket.create_connection((net["b"].ip, server.port), timeout=1).close()
        pid = server.proc.pid
        assert int(pid) in netns_hosts._pids_in(net["b"].netns)
    assert net.leftovers() == []
    assert root_links() == links_before
    assert server.proc.poll() is not None, "the server outlived the network"


def test_cut_partitions_without_reset_and_restore_resumes():
    with Network(["a", "b"]) as net:
        server = echo_server(net["b"])
        sock = net["a"].connect(net["b"].ip, server.port)
        assert roundtrip(sock) == b"ping"
        net.cut("b")
        # No answer, no reset: the bytes wait in a's send queue; both processes live on.
        assert roundtrip(sock, b"during", timeout=1.5) is None
        assert server.alive()
        with pytest.raises(OSError):
            net["a"].connect(net["b"].ip, server.port, timeout=1.5).close()
        # b's own address still answers inside b.
        with net["b"].connect(net["b"].ip, server.port) as local:
            assert roundtrip(local) == b"ping"
        net.restore("b")
        # TCP retransmits what was sent during the cut: the same connection goes on.
        sock.settimeout(30)
        got = b""
        while len(got) < len(b"during"):
            got += sock.recv(100)
        assert got == b"during"
        assert roundtrip(sock, b"after") == b"after"
        sock.close()


def test_cut_between_drops_one_pair_only():
    with Network(["a", "b", "c"]) as net:
        server = echo_server(net["b"])
        net.cut_between("a", "b")
        with pytest.raises(OSError):
            net["a"].connect(net["b"].ip, server.port, timeout=1.5).close()
        with net["c"].connect(net["b"].ip, server.port) as sock:
            assert roundtrip(sock) == b"ping"
        net.restore_between("a", "b")
        with net["a"].connect(net["b"].ip, server.port) as sock:
            assert roundtrip(sock) == b"ping"


def test_rate_limit_slows_a_transfer():
    with Network(["a", "b"]) as net:
        server = echo_server(net["b"])
        payload = b"k" * (1 << 20)  # 1 MiB each way

        def seconds():
            with net["a"].connect(net["b"].ip, server.port) as sock:
                start = time.monotonic()
                assert roundtrip(sock, payload, timeout=60) == payload
                return time.monotonic() - start

        fast = seconds()
        what = net.shape("a", rate_mbit=8)
        slow = seconds()
        print(f"1 MiB echoed in {fast:.3f} s, then {slow:.3f} s with {what}")
        # 8 Mbit/s is 1 MiB in about 1.05 s; the echo crosses a's link both ways.
        assert slow > 0.9 and slow > 5 * fast, (fast, slow)
        net.unshape("a")
        assert seconds() < slow / 3


def test_loss_drops_about_the_asked_share():
    with Network(["a", "b"]) as net:
        receiver = net["b"].within(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        receiver.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 8 << 20)
        receiver.bind((net["b"].ip, 0))
        receiver.settimeout(1.0)
        sender = net["a"].within(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))

        def delivered(count):
            """How many of `count` numbered datagrams a -> b arrive (sent in bursts of 50, a
            burst once the previous one has drained from the socket buffers)."""
            seen = set()
            for burst in range(0, count, 50):
                for i in range(burst, min(burst + 50, count)):
                    sender.sendto(b"%d" % i, receiver.getsockname())
                time.sleep(0.01)
            try:
                while len(seen) < count:
                    seen.add(int(receiver.recv(100)))
            except socket.timeout:
                pass
            return len(seen)

        assert delivered(400) == 400
        what = net.shape("a", loss_pct=20)
        got = delivered(2000)
        print(f"{got} of 2000 datagrams delivered with {what}")
        # a's link drops 20% of what a sends (its own egress; its bridge port's egress is the
        # other way): 1600 expected, and the bounds are 6 standard deviations (18) either side.
        assert 1490 < got < 1710, got
        net.unshape("a")
        assert delivered(400) == 400
        sender.close()
        receiver.close()


def test_delay_needs_netem():
    with Network(["a", "b"]) as net:
        if not netns_hosts.netem_available():
            with pytest.raises(ValueError, match="netem"):
                net.shape("a", delay_ms=50)
            pytest.skip("the kernel has no sch_netem qdisc ('Specified qdisc kind is unknown'): "
                        "delays cannot be emulated here")
        server = echo_server(net["b"])
        with net["a"].connect(net["b"].ip, server.port) as sock:
            net.shape("a", delay_ms=50)
            start = time.monotonic()
            assert roundtrip(sock) == b"ping"
            assert time.monotonic() - start >= 0.09  # 50 ms each way


def test_stale_namespaces_of_a_dead_run_are_removed():
    dead = 4194304 + 1  # above pid_max: no process has it
    stale = f"{PREFIX}{dead}-switch"
    alive = f"{PREFIX}{os.getppid()}-keep"  # a live pid (ours' parent): not stale
    other = "tdmother-keep"                 # not our prefix
    for name in (stale, alive, other):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert netns_hosts.remove_stale_namespaces() == [stale]
        names = our_namespaces() + [other]
        assert stale not in our_namespaces() and alive in names
    finally:
        for name in (stale, alive, other):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
