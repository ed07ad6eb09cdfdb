"""KV transfers between real processes over UCX, on loopback (kvtransfer/, docs/kvtransfer.md).

Each test starts `kv_peer` processes (tests/kvtransfer/kv_peer.cc) as pool owners (decode workers)
and writers (prefill workers) and drives them over stdin/stdout lines; descriptors travel as hex of
the serialized tandem.v1.KvPoolDescriptor, as they would inside a worker's RPC. Every test runs over
UCX shared memory ("posix,self") and over TCP ("tcp,self").

The writer fills its pool from a seed; every notification names the seed and the block pairs, and
the owner, on each notification, computes the bytes it must already hold and compares them with
its pool exactly. So the owner's NOTE lines say whether a notification arrived after its data.

Nothing here waits without a timeout: a peer that does not answer fails the test with its logs.

Environment: TANDEM_BIN_DIR (where kv_peer is; set by ctest).
"""
import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

KV_PEER = Path(os.environ["TANDEM_BIN_DIR"]) / "kv_peer"

# UCX itself leaks a few objects (libuct/libucs/libucp allocations, e.g. after a peer died), which
# LeakSanitizer (ASan builds) reports at exit. Only allocations made inside UCX are suppressed, not
# leak detection as a whole (ASAN_OPTIONS=detect_leaks=0): a leak in Tandem's own code still fails
# the peer's exit status, which every test checks on QUIT.
LSAN_SUPPRESSIONS = "leak:libuct.so\nleak:libucs.so\nleak:libucp.so\nleak:libucm.so\n"

WAIT_S = 15.0          # the longest any single answer may take on a loaded 2-core machine
OP_TIMEOUT_MS = 2000   # the writers' per-operation deadline in the failure tests
SLACK_S = 2.0          # how late after a deadline an error may arrive
# What Connect says of a descriptor whose owner is gone (UCX fails to reach it, or reaches a stranger).
STALE_PEER = r"cannot reach the peer|the peer failed|send failed|the descriptor is stale"


class PeerFailure(AssertionError):
    pass


class Peer:
    """One kv_peer process; lines it prints are collected with their arrival time."""

    def __init__(self, tmp: Path, role: str, name: str, tls: str, **flags):
        self.name = name
        self.log = tmp / f"{name}.log"
        self.ucx_log = tmp / f"{name}.ucx.log"
        supp = tmp / "lsan.supp"
        if not supp.exists():
            supp.write_text(LSAN_SUPPRESSIONS)
        env = dict(os.environ, UCX_LOG_FILE=str(self.ucx_log),
                   LSAN_OPTIONS=f"suppressions={supp}:print_suppressions=0")
        args = [str(KV_PEER), f"--role={role}", f"--name={name}", f"--tls={tls}"]
        args += [f"--{k}={v}" for k, v in flags.items()]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, text=True, bufsize=1, env=env)
        self.lines: list[tuple[float, str]] = []
        self.eof = False
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def send(self, line: str):
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise PeerFailure(f"{self.name} is gone (rc {self.proc.poll()}); could not send "
                              f"{line[:80]!r}\n{self.diagnostics()}") from None

    def wait(self, pattern: str, timeout: float = WAIT_S, after: int = 0):
        """The first line from index `after` that matches `pattern`: (index, arrival time, match)."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        i = after
        with self.cond:
            while True:
                while i < len(self.lines):
                    m = regex.match(self.lines[i][1])
                    if m:
                        return i, self.lines[i][0], m
                    i += 1
                if self.eof:
                    raise PeerFailure(f"{self.name} exited (rc {self.proc.poll()}) before printing "
                                      f"/{pattern}/\n{self.diagnostics()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PeerFailure(f"{self.name}: no /{pattern}/ within {timeout} s\n"
                                      f"{self.diagnostics()}")
                self.cond.wait(left)

    def matching(self, pattern: str) -> list[re.Match]:
        regex = re.compile(pattern)
        with self.cond:
            return [m for _, line in self.lines if (m := regex.match(line))]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ping(self):
        n = len(self.lines)
        self.send("PING")
        self.wait(r"PONG$", after=n)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=WAIT_S)

    def quit(self, allow_leaks: bool = False):
        """Ends the peer and checks it exits cleanly (under ASan: no error; no leak unless
        `allow_leaks`, for tests whose subject is something else: a leak has a test of its own)."""
        self.send("QUIT")
        self.wait(r"BYE$")
        try:
            rc = self.proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            raise PeerFailure(f"{self.name} did not exit after QUIT\n{self.diagnostics()}")
        log = self.log.read_text(errors="replace")
        if allow_leaks and "ERROR: LeakSanitizer" in log and "ERROR: AddressSanitizer" not in log:
            return
        why = (" (LeakSanitizer: memory leaked, see the log)" if "LeakSanitizer" in log else
               " (AddressSanitizer report, see the log)" if "AddressSanitizer" in log else "")
        assert rc == 0, f"{self.name} exited with {rc}{why}\n{self.diagnostics()}"

    def close(self):
        if self.alive():
            self.proc.kill()
            self.proc.wait(timeout=WAIT_S)

    def diagnostics(self) -> str:
        with self.cond:
            out = "\n".join(line for _, line in self.lines[-40:])
        text = f"--- {self.name} stdout (last lines):\n{out}\n"
        for path in (self.log, self.ucx_log):
            if path.exists():
                text += f"--- {path.name} (tail):\n{path.read_text(errors='replace')[-6000:]}\n"
        return text


class Owner(Peer):
    def __init__(self, tmp, name, tls, **flags):
        super().__init__(tmp, "owner", name, tls, **flags)
        self.descriptor = self.wait(r"DESCRIPTOR ([0-9a-f]+)$")[2][1]

    def wait_done(self, req: str, timeout_ms: int = 10000) -> str:
        n = len(self.lines)
        self.send(f"WAIT_DONE {req} {timeout_ms}")
        return self.wait(rf"DONE_\w+ {req}\b.*", timeout=timeout_ms / 1000 + WAIT_S, after=n)[2][0]

    def untouched(self, blocks) -> str:
        n = len(self.lines)
        self.send(f"UNTOUCHED {','.join(map(str, blocks)) or '-'}")
        return self.wait(r"UNTOUCHED_\w+.*", after=n)[2][0]

    def notes(self, req: str) -> list[tuple[str, int, str]]:
        """(PART|DONE, last layer, OK|BAD ...) of each notification of `req`, in arrival order."""
        return [(m[1], int(m[2]), m[3]) for m in self.matching(rf"NOTE (PART|DONE) {req} (\d+) (.*)$")]


class Writer(Peer):
    def __init__(self, tmp, name, tls, **flags):
        super().__init__(tmp, "writer", name, tls, **flags)
        self.wait(r"READY$")

    def connect(self, conn: str, descriptor: str, timeout_ms: int = 5000) -> re.Match:
        """CONNECTED <conn> <describe> or CONNECT_ERROR <conn> <ms> <CODE> <message>."""
        n = len(self.lines)
        self.send(f"CONNECT {conn} {descriptor} {timeout_ms}")
        return self.wait(rf"(CONNECTED|CONNECT_ERROR) {conn} (.*)$",
                         timeout=timeout_ms / 1000 + WAIT_S, after=n)[2]

    def start_transfer(self, conn, req, pairs, op_timeout_ms=10000, layers_per_step=1, pace_ms=0):
        text = ",".join(f"{s}:{d}" for s, d in pairs) or "-"
        self.send(f"TRANSFER {conn} {req} {op_timeout_ms} {layers_per_step} {pace_ms} {text}")

    def transfer_result(self, req, timeout=WAIT_S):
        """(arrival time, match of TRANSFER_OK|TRANSFER_ERROR|TRANSFER_HUNG <req> ...)."""
        _, when, m = self.wait(rf"(TRANSFER_\w+) {req} (.*)$", timeout=timeout)
        return when, m


@pytest.fixture(params=["posix,self", "tcp,self"], ids=["posix", "tcp"])
def tls(request):
    return request.param


@pytest.fixture
def peers(tmp_path):
    """Starts peers (`peers.owner(...)`, `peers.writer(...)`) and kills what is left at the end."""
    started: list[Peer] = []

    class Factory:
        @staticmethod
        def owner(name, tls, **flags) -> Owner:
            p = Owner(tmp_path, name, tls, **flags)
            started.append(p)
            return p

        @staticmethod
        def writer(name, tls, **flags) -> Writer:
            p = Writer(tmp_path, name, tls, **flags)
            started.append(p)
            return p

    yield Factory
    for p in started:
        p.close()


def expect_connected(writer: Writer, conn: str, owner: Owner):
    m = writer.connect(conn, owner.descriptor)
    assert m[1] == "CONNECTED", (f"{m[0]}\n{owner.name} is {'up' if owner.alive() else 'gone'}\n"
                                 f"{writer.diagnostics()}\n{owner.diagnostics()}")
    return m


def expect_transfer_ok(writer: Writer, owner: Owner, req: str, layers: int, layers_per_step: int,
                       ordered: bool = True):
    """The transfer succeeded, the owner got every notification, each after the bytes it
    announced, and (when `ordered`) in the order they were sent."""
    _, m = writer.transfer_result(req)
    assert m[1] == "TRANSFER_OK", f"{m[0]}\n{writer.diagnostics()}\n{owner.diagnostics()}"
    assert owner.wait_done(req) == f"DONE_OK {req}", owner.diagnostics()
    lasts = list(range(layers_per_step - 1, layers - 1, layers_per_step)) + [layers - 1]
    expected = [("PART", last, "OK") for last in lasts[:-1]] + [("DONE", layers - 1, "OK")]
    notes = owner.notes(req)
    if ordered:
        assert notes == expected, f"{req}: notifications {notes}, expected {expected}"
        return
    # The owner flags a notification that arrived out of order; its data check comes after ". ".
    in_place = [(kind, last, re.sub(r"^BAD (out of order: .*?|a notification after DONE)\. $",
                                    "OK", status)) for kind, last, status in notes]
    assert sorted(in_place) == sorted(expected), f"{req}: notifications {notes}"


def out_of_order(owner: Owner, req: str) -> list:
    return [n for n in owner.notes(req) if n[2] != "OK"]


def random_pairs(rng, n, src_blocks, dst_pool):
    """`n` pairs with distinct destinations drawn (and removed) from `dst_pool`."""
    pairs = []
    for _ in range(n):
        dst = dst_pool.pop(rng.randrange(len(dst_pool)))
        pairs.append((rng.randrange(src_blocks), dst))
    return pairs


# ---------------------------------------------------------------------------------------------
# 1, 2. Bytes arrive exactly, layer by layer; notifications in order and after their data.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("block_size,layers", [(1, 1), (16, 4), (32, 30)])
def test_blocks_arrive_exactly(peers, tls, block_size, layers):
    rng = random.Random(f"{tls}/{block_size}/{layers}")
    shape = dict(layers=layers, block_size=block_size, kv_heads=2, head_dim=16)
    owner = peers.owner("owner", tls, blocks=48, **shape)
    writer = peers.writer("writer", tls, blocks=24, seed=rng.randrange(1, 2**40), **shape)
    expect_connected(writer, "c", owner)
    free = list(range(48))
    # Two requests at once on one connection: one layer per write, and three per write.
    requests = {"one": (random_pairs(rng, 8, 24, free), 1),
                "three": (random_pairs(rng, 8, 24, free), 3)}
    for req, (pairs, step) in requests.items():
        writer.start_transfer("c", req, pairs, layers_per_step=step)
    for req, (_, step) in requests.items():
        expect_transfer_ok(writer, owner, req, layers, step)
    # Nothing landed outside the destination blocks.
    assert owner.untouched(free) == "UNTOUCHED_OK", owner.diagnostics()
    writer.quit()
    owner.quit()


def test_partial_notifications_follow_their_data(peers, tls):
    """Large writes (16 blocks x 8 KiB per layer) pipelined without waiting, four requests at once
    on one connection: each partial notification must find every layer it announces in place."""
    rng = random.Random(tls)
    shape = dict(layers=30, block_size=32, kv_heads=2, head_dim=16)
    owner = peers.owner("owner", tls, blocks=64, **shape)
    writer = peers.writer("writer", tls, blocks=32, seed=11, **shape)
    expect_connected(writer, "c", owner)
    free = list(range(64))
    reqs = [f"r{i}" for i in range(4)]
    for req in reqs:
        writer.start_transfer("c", req, random_pairs(rng, 16, 32, free))
    for req in reqs:
        expect_transfer_ok(writer, owner, req, 30, 1)
    writer.quit()
    owner.quit()


# ---------------------------------------------------------------------------------------------
# 3. A peer killed mid-transfer.
# ---------------------------------------------------------------------------------------------

SHAPE = dict(layers=30, block_size=16, kv_heads=2, head_dim=16)
PACE_MS = 100  # between layers: a 30-layer transfer takes 3 s, so a kill lands in the middle


def test_owner_killed_mid_transfer(peers, tls):
    owner = peers.owner("owner1", tls, blocks=32, **SHAPE)
    writer = peers.writer("writer", tls, blocks=32, seed=3, **SHAPE)
    expect_connected(writer, "c1", owner)
    writer.start_transfer("c1", "r1", [(1, 2), (5, 9)], op_timeout_ms=OP_TIMEOUT_MS,
                          pace_ms=PACE_MS)
    owner.wait(r"NOTE PART r1 1 OK$")  # two layers are in: mid-transfer
    owner.kill()
    killed = time.monotonic()
    when, m = writer.transfer_result("r1", timeout=OP_TIMEOUT_MS / 1000 + WAIT_S)
    assert m[1] == "TRANSFER_ERROR", m[0]
    code = m[2].split()[1]
    assert code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"), m[0]
    # The error came within the deadline of the operations outstanding at the kill.
    late = when - killed
    assert late <= (OP_TIMEOUT_MS + PACE_MS) / 1000 + SLACK_S, f"{m[0]} arrived {late:.2f} s after the kill"

    # The writer keeps serving: the dead owner's descriptor is refused, a new owner is served.
    assert writer.alive()
    writer.ping()
    m = writer.connect("stale", owner.descriptor, timeout_ms=OP_TIMEOUT_MS)
    assert m[1] == "CONNECT_ERROR", m[0]
    _, code, message = m[2].split(" ", 2)
    assert code in ("UNAVAILABLE", "FAILED_PRECONDITION"), m[0]
    assert re.search(STALE_PEER, message), m[0]
    owner2 = peers.owner("owner2", tls, blocks=32, **SHAPE)
    expect_connected(writer, "c2", owner2)
    writer.start_transfer("c2", "r2", [(1, 2), (5, 9), (7, 31)])
    expect_transfer_ok(writer, owner2, "r2", 30, 1)
    writer.quit(allow_leaks=True)  # test_writer_leaks_nothing_when_its_owner_dies
    owner2.quit()


def test_writer_leaks_nothing_when_its_owner_dies(peers, tls):
    """Operations cut short by a dead owner still release what they hold: under ASan the writer
    exits without a leak report."""
    owner = peers.owner("owner", tls, blocks=32, **SHAPE)
    writer = peers.writer("writer", tls, blocks=32, seed=8, **SHAPE)
    expect_connected(writer, "c", owner)
    writer.start_transfer("c", "r1", [(1, 2), (5, 9)], op_timeout_ms=OP_TIMEOUT_MS,
                          pace_ms=PACE_MS)
    owner.wait(r"NOTE PART r1 1 OK$")
    owner.kill()
    _, m = writer.transfer_result("r1", timeout=OP_TIMEOUT_MS / 1000 + WAIT_S)
    assert m[1] == "TRANSFER_ERROR", m[0]
    writer.quit()


def test_writer_killed_mid_transfer(peers, tls):
    owner = peers.owner("owner", tls, blocks=32, **SHAPE)
    writer = peers.writer("writer1", tls, blocks=32, seed=4, **SHAPE)
    expect_connected(writer, "c", owner)
    writer.start_transfer("c", "r1", [(0, 3), (6, 4)], op_timeout_ms=OP_TIMEOUT_MS,
                          pace_ms=PACE_MS)
    owner.wait(r"NOTE PART r1 1 OK$")
    writer.kill()
    # The owner's own deadline for the final notification expires; it says so and stays up.
    start = time.monotonic()
    assert owner.wait_done("r1", timeout_ms=OP_TIMEOUT_MS).startswith("DONE_TIMEOUT r1")
    waited = time.monotonic() - start
    assert OP_TIMEOUT_MS / 1000 <= waited + 0.05 <= OP_TIMEOUT_MS / 1000 + SLACK_S, waited
    assert owner.alive()
    owner.ping()
    # A new writer (other content) completes a transfer into the same, half-written blocks.
    writer2 = peers.writer("writer2", tls, blocks=32, seed=5, **SHAPE)
    expect_connected(writer2, "c", owner)
    writer2.start_transfer("c", "r2", [(0, 3), (6, 4)])
    expect_transfer_ok(writer2, owner, "r2", 30, 1)
    writer2.quit()
    owner.quit()


def test_owner_survives_a_writer_killed_while_it_handles_its_notification(peers, tls):
    """The owner's handler is still running for a notification when its writer dies; the owner
    then acknowledges to a writer that is gone. It must stay up and serve the next writer."""
    owner = peers.owner("owner", tls, blocks=32, **SHAPE)
    writer = peers.writer("writer1", tls, blocks=32, seed=6, **SHAPE)
    expect_connected(writer, "c", owner)
    owner.send("HOLD")
    owner.wait(r"HOLDING$")
    writer.start_transfer("c", "r1", [(0, 3)], op_timeout_ms=OP_TIMEOUT_MS, pace_ms=PACE_MS)
    owner.wait(r"HELD r1 0$")  # the handler runs (and waits) for the first notification
    writer.kill()
    owner.send("RELEASE")
    owner.wait(r"RELEASED$")
    owner.wait(r"NOTE PART r1 0 OK$")
    owner.ping()
    assert owner.alive(), owner.diagnostics()
    writer2 = peers.writer("writer2", tls, blocks=32, seed=7, **SHAPE)
    expect_connected(writer2, "c", owner)
    writer2.start_transfer("c", "r2", [(0, 3), (1, 4)])
    expect_transfer_ok(writer2, owner, "r2", 30, 1)
    writer2.quit()
    owner.quit()


# ---------------------------------------------------------------------------------------------
# 4. Wrong, forged and stale descriptors; writes that cannot start.
# ---------------------------------------------------------------------------------------------

def _varint(data: bytes, i: int):
    value, shift = 0, 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def proto_fields(data: bytes):
    """Top-level fields of a serialized message: [(number, wire type, int or bytes)]."""
    fields, i = [], 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            n, i = _varint(data, i)
            value, i = data[i:i + n], i + n
        else:
            raise AssertionError(f"unexpected wire type {wire} in a KvPoolDescriptor")
        fields.append((number, wire, value))
    return fields


def proto_bytes(fields) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += _encode_varint(number << 3 | wire)
        out += _encode_varint(value) if wire == 0 else _encode_varint(len(value)) + value
    return bytes(out)


# tandem.v1.KvPoolDescriptor field numbers.
TRANSPORT, TRANSPORT_ADDRESS, POOL_EPOCH = 1, 2, 5


def forge(descriptor_hex: str, number: int, change) -> str:
    fields = proto_fields(bytes.fromhex(descriptor_hex))
    assert number in [f[0] for f in fields], (number, fields)
    fields = [(n, w, change(v) if n == number else v) for n, w, v in fields]
    return proto_bytes(fields).hex()


def test_descriptor_codec_round_trips(peers):
    """The forging below edits the wire format by hand; unchanged, it must give the same bytes."""
    owner = peers.owner("owner", "tcp,self")
    data = bytes.fromhex(owner.descriptor)
    fields = proto_fields(data)
    assert proto_bytes(fields) == data
    numbers = [f[0] for f in fields]
    assert {TRANSPORT, TRANSPORT_ADDRESS, 3, 4, POOL_EPOCH} <= set(numbers)
    assert dict((n, v) for n, _, v in fields)[TRANSPORT] == b"ucx"
    owner.quit()


def connect_error(writer: Writer, conn: str, descriptor: str, timeout_ms: int = 5000):
    m = writer.connect(conn, descriptor, timeout_ms)
    assert m[1] == "CONNECT_ERROR", f"{m[0]} (expected an error)"
    ms, code, message = m[2].split(" ", 2)
    return int(ms), code, message


def test_bad_descriptors_and_writes(peers, tls):
    owner = peers.owner("owner", tls, blocks=48)
    writer = peers.writer("writer", tls, blocks=24)
    d = owner.descriptor

    _, code, message = connect_error(writer, "forged-epoch", forge(d, POOL_EPOCH, lambda e: e + 1))
    assert code == "FAILED_PRECONDITION" and "stale" in message, message
    _, code, message = connect_error(writer, "old-epoch", forge(d, POOL_EPOCH, lambda e: e - 1))
    assert code == "FAILED_PRECONDITION" and "stale" in message, message

    def flip_last(address: bytes) -> bytes:
        return address[:-1] + bytes([address[-1] ^ 0x5A])

    _, code, message = connect_error(writer, "corrupt", forge(d, TRANSPORT_ADDRESS, flip_last))
    assert (code, message) == ("INVALID_ARGUMENT",
                               "the descriptor's UCX address is corrupt (checksum)")
    _, code, message = connect_error(writer, "truncated",
                                     forge(d, TRANSPORT_ADDRESS, lambda a: a[:-3]))
    assert (code, message) == ("INVALID_ARGUMENT", "the descriptor's UCX address is truncated")
    _, code, message = connect_error(writer, "foreign",
                                     forge(d, TRANSPORT_ADDRESS, lambda a: b"XXXX" + a[4:]))
    assert (code, message) == ("INVALID_ARGUMENT",
                               "the descriptor's address is not a Tandem UCX address")
    _, code, message = connect_error(writer, "inproc", forge(d, TRANSPORT, lambda t: b"inproc"))
    assert (code, message) == ("INVALID_ARGUMENT", "a descriptor of transport 'inproc' given to UCX")

    other = peers.owner("other-shape", tls, blocks=48, layers=5)
    _, code, message = connect_error(writer, "shape", other.descriptor)
    assert code == "INVALID_ARGUMENT" and message.startswith("KV layouts differ"), message
    other.quit()

    # Writes that cannot start fail at once with a clear error and leave the connection usable.
    expect_connected(writer, "c", owner)
    refused = {
        "empty": ([], "the write names no blocks"),
        "dst": ([(0, 1), (1, 48)], "destination block 48 is outside the peer's pool of 48"),
        "src": ([(24, 0)], "source block 24 is outside the local pool of 24"),
        "negative": ([(-1, 0)], "source block -1 is outside the local pool of 24"),
    }
    for req, (pairs, text) in refused.items():
        writer.start_transfer("c", req, pairs)
        _, m = writer.transfer_result(req)
        assert m[1] == "TRANSFER_ERROR", m[0]
        assert m[2].split(" ", 2)[1:] == ["INVALID_ARGUMENT", text], m[0]
    assert owner.notes(r"\S+") == []  # nothing of the refused writes reached the owner
    writer.start_transfer("c", "good", [(0, 1), (23, 47)])
    expect_transfer_ok(writer, owner, "good", 4, 1)

    # An owner that has exited: its descriptor is stale, and the open connection fails too.
    owner.quit()
    ms, code, message = connect_error(writer, "gone", d, timeout_ms=OP_TIMEOUT_MS)
    assert code in ("UNAVAILABLE", "FAILED_PRECONDITION"), (code, message)
    assert re.search(STALE_PEER, message), message
    assert ms <= OP_TIMEOUT_MS + SLACK_S * 1000, ms
    writer.start_transfer("c", "after-exit", [(0, 1)], op_timeout_ms=OP_TIMEOUT_MS)
    _, m = writer.transfer_result("after-exit", timeout=OP_TIMEOUT_MS / 1000 + WAIT_S)
    assert m[1] == "TRANSFER_ERROR", m[0]
    assert m[2].split()[1] in ("UNAVAILABLE", "DEADLINE_EXCEEDED"), m[0]
    writer.quit(allow_leaks=True)  # test_writer_leaks_nothing_when_its_owner_dies


# ---------------------------------------------------------------------------------------------
# 5. Many concurrent transfers to several peers.
# ---------------------------------------------------------------------------------------------

CONCURRENT = 20


def test_one_writer_to_three_owners(peers, tls):
    rng = random.Random(f"fan-out {tls}")
    owners = [peers.owner(f"owner{i}", tls, blocks=2 * CONCURRENT) for i in range(3)]
    writer = peers.writer("writer", tls, blocks=16, seed=21)
    plan = {}
    for i, owner in enumerate(owners):
        expect_connected(writer, f"c{i}", owner)
        free = list(range(2 * CONCURRENT))
        for j in range(CONCURRENT):
            plan[f"o{i}-{j}"] = (i, random_pairs(rng, 2, 16, free))
    for req, (i, pairs) in plan.items():  # all 60 at once, interleaved across the owners
        writer.start_transfer(f"c{i}", req, pairs)
    for req, (i, _) in plan.items():  # (order: test_notifications_keep_their_order_under_load)
        expect_transfer_ok(writer, owners[i], req, 4, 1, ordered=False)
    writer.quit()
    for owner in owners:
        owner.quit()


def test_three_writers_to_one_owner(peers, tls):
    rng = random.Random(f"fan-in {tls}")
    owner = peers.owner("owner", tls, blocks=6 * CONCURRENT)
    writers = [peers.writer(f"writer{i}", tls, blocks=16, seed=100 + i) for i in range(3)]
    free = list(range(6 * CONCURRENT))
    plan = {}
    for i, writer in enumerate(writers):
        expect_connected(writer, "c", owner)
        for j in range(CONCURRENT):
            plan[f"w{i}-{j}"] = (i, random_pairs(rng, 2, 16, free))
    for req, (i, pairs) in plan.items():
        writers[i].start_transfer("c", req, pairs)
    for req, (i, _) in plan.items():  # (order: test_notifications_keep_their_order_under_load)
        expect_transfer_ok(writers[i], owner, req, 4, 1, ordered=False)
    for writer in writers:
        writer.quit()
    owner.quit()


def test_notifications_keep_their_order_under_load(peers, tls):
    """Three writers' concurrent transfers into one owner, each announcing layer after layer: no
    notification may overtake an earlier one of its transfer. A few rounds, since an overtaking
    depends on timing."""
    owner = peers.owner("owner", tls, blocks=3 * CONCURRENT)
    writers = [peers.writer(f"writer{i}", tls, blocks=CONCURRENT, seed=200 + i) for i in range(3)]
    for writer in writers:
        expect_connected(writer, "c", owner)
    for round in range(4):
        # Rounds run one after the other, so each may use the same destination blocks.
        plan = {f"r{round}-w{i}-{j}": (writers[i], [(j, i * CONCURRENT + j)])
                for i in range(3) for j in range(CONCURRENT)}
        for req, (writer, pairs) in plan.items():
            writer.start_transfer("c", req, pairs)
        for req, (writer, _) in plan.items():
            expect_transfer_ok(writer, owner, req, 4, 1, ordered=False)
        overtaken = {req: out_of_order(owner, req) for req in plan}
        overtaken = {req: notes for req, notes in overtaken.items() if notes}
        assert not overtaken, f"round {round}: notifications overtook earlier ones: {overtaken}"
    for writer in writers:
        writer.quit()
    owner.quit()
