"""router_bench: the router under many connections, on a real local cluster (`tandem up`).

  .venv/bin/python bench/router_bench.py [--bin build/release/bin] [--streams 1000] [--requests 300]

1. Holds --streams concurrent streaming chat requests (server-sent events) open at once, on one
   asyncio thread here: the decode worker runs a few at a time and the rest wait in its queue, so
   most streams are idle. Prints the router's resident memory before, with all streams open, and
   after they were all cancelled by closing the connections, and whether every stream got its
   headers (the router held them all); and the router's and the decode worker's thread counts
   idle and with every stream open (both hops use gRPC's callback API: no thread per stream).
2. Sends --requests short requests at --concurrency and prints the router's own overhead per
   request (hashing, placement, starting the relay; `tandem_router_overhead_seconds`, measured
   inside the router) as p50 / p99 estimated from the histogram, against the targets
   p50 <= 1 ms and p99 <= 5 ms.
"""
import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def threads(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def child_pid(up_pid, binary):
    out = subprocess.run(["pgrep", "-P", str(up_pid), "-f", binary], capture_output=True,
                         text=True).stdout.split()
    return int(out[0]) if out else None


async def open_stream(port, body, ready, release, results, i):
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as error:
        results[i] = f"connect: {error}"
        ready.release()
        return
    data = json.dumps(body).encode()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    try:
        status = await asyncio.wait_for(reader.readline(), 120)
        results[i] = status.decode().strip()
    except Exception as error:  # noqa: BLE001
        results[i] = f"no answer: {error}"
    ready.release()
    await release.wait()
    writer.close()


async def hold_streams(port, n, hold_s, router, decode):
    body = {"messages": [{"role": "user", "content": "Count from one to one thousand."}],
            "max_tokens": 500, "temperature": 0, "stream": True}
    ready = asyncio.Semaphore(0)
    release = asyncio.Event()
    results = [None] * n
    tasks = [asyncio.create_task(open_stream(port, body, ready, release, results, i))
             for i in range(n)]
    for _ in range(n):
        await asyncio.wait_for(ready.acquire(), 300)
    held = sum(1 for r in results if r and r.startswith("HTTP/1.1 200"))
    rss_open = rss_kib(router)
    open_threads = {"router": threads(router), "decode worker": threads(decode)}
    decode_rss_open = rss_kib(decode)
    await asyncio.sleep(hold_s)
    rss_held = rss_kib(router)
    release.set()
    await asyncio.gather(*tasks)
    failures = [r for r in results if not (r and r.startswith("HTTP/1.1 200"))]
    return held, rss_open, rss_held, failures[:3], open_threads, decode_rss_open


def quantile_from_histogram(text, name, q):
    buckets = []
    for m in re.finditer(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', text, re.M):
        le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
        buckets.append((le, float(m.group(2))))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0
    if total == 0:
        return None, 0
    for le, count in buckets:
        if count >= q * total:
            return le, int(total)
    return float("inf"), int(total)


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "build", "release", "bin"))
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--hold_s", type=float, default=10)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    up = subprocess.Popen([os.path.join(args.bin, "tandem"), "up", "--http_port=0", "--grpc_port=0",
                           "--decode_workers=1", "--prefill_workers=1", "--worker_kv_cache_mb=256"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = None
        for line in up.stdout:
            if "OpenAI HTTP API: http://127.0.0.1:" in line:
                port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
            if "Ctrl-C stops the cluster" in line:
                break
        if port is None:
            sys.exit("tandem up did not start")
        router = child_pid(up.pid, "tandem-router")
        decode = child_pid(up.pid, "tandem-decode")
        rss_idle = rss_kib(router)
        decode_rss_idle = rss_kib(decode)
        idle_threads = {"router": threads(router), "decode worker": threads(decode)}
        t0 = time.monotonic()
        held, rss_open, rss_held, failures, open_threads, decode_rss_open = asyncio.run(
            hold_streams(port, args.streams, args.hold_s, router, decode))
        time.sleep(2)
        rss_after = rss_kib(router)
        print(f"\nrouter_bench: {args.streams} concurrent SSE streams (chat, max_tokens 500, 1 decode "
              f"worker running 64 at a time, the rest queued)")
        print(f"  streams answered 200 and held open: {held}/{args.streams}  "
              f"({time.monotonic() - t0:.1f} s to open, hold {args.hold_s:.0f} s and close)")
        if failures:
            print(f"  failures (first 3): {failures}")
        print(f"  router RSS: idle {rss_idle / 1024:.1f} MiB, all open {rss_open / 1024:.1f} MiB, "
              f"after {args.hold_s:.0f} s {rss_held / 1024:.1f} MiB, all closed {rss_after / 1024:.1f} MiB "
              f"({(rss_held - rss_idle) / max(1, args.streams):.1f} KiB per stream)")
        print(f"  decode worker RSS: idle {decode_rss_idle / 1024:.1f} MiB, all open "
              f"{decode_rss_open / 1024:.1f} MiB")
        for name in idle_threads:
            print(f"  {name} threads: idle {idle_threads[name]}, all open {open_threads[name]}")

        # Overhead under load.
        def one(i):
            return post(port, {"prompt": f"Request {i}: the quick brown fox", "max_tokens": 4,
                               "temperature": 0})
        from concurrent.futures import ThreadPoolExecutor
        t0 = time.monotonic()
        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(one, range(args.requests)))
        elapsed = time.monotonic() - t0
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        p50, n = quantile_from_histogram(text, "tandem_router_overhead_seconds", 0.50)
        p99, _ = quantile_from_histogram(text, "tandem_router_overhead_seconds", 0.99)
        print(f"\nrouter overhead over {n} requests ({args.requests} at concurrency {args.concurrency}, "
              f"{args.requests / elapsed:.1f} req/s): p50 <= {p50 * 1e3:.2f} ms (target 1 ms: "
              f"{'met' if p50 <= 1e-3 else 'MISSED'}), p99 <= {p99 * 1e3:.2f} ms (target 5 ms: "
              f"{'met' if p99 <= 5e-3 else 'MISSED'}); upper bucket bounds of "
              "tandem_router_overhead_seconds")
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()


if __name__ == "__main__":
    main()
