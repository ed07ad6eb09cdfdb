"""A stand-in for sim/'s tandem_sim in the tests of `tandem sim`'s Python side: it honours the
command line and the files of /work/notes/sim_contract.md (docs/sim.md, "The files") with a
deliberately crude model, so that the plumbing can be tested without the real simulator. It is
NOT a simulator: the figures it makes say nothing about a cluster.

Model: the decode (or "both") workers take requests round robin; each serves one at a time, FIFO:
prefill = base + prefill_token * uncached prompt tokens, then output_tokens - 1 steps of
base + decode_token. A prefix group's tokens are cached from its second request on.
cluster.json's {"admission": {"max_wait_s": W}} sheds a request that would wait longer than W.
Writes no itl_ms. Exit 2 with a message naming the file, line and field on bad input.
"""
import json
import sys
import time


def fail(message):
    print(f"tandem_sim: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv):
    flags = {}
    for arg in argv:
        name, _, value = arg.lstrip("-").partition("=")
        flags[name] = value
    for name in ("cluster", "trace", "out"):
        if not flags.get(name):
            fail(f"--{name} is required")
    start = time.monotonic()
    with open(flags["cluster"]) as f:
        cluster = json.load(f)
    workers = []
    for i, pool in enumerate(cluster.get("pools", [])):
        profile = pool.get("profile")
        if isinstance(profile, str):
            with open(profile) as f:
                profile = json.load(f)
        if not isinstance(profile, dict) or "step" not in profile:
            fail(f"{flags['cluster']}: pools[{i}].profile: not a profile")
        if pool.get("role") in ("decode", "both"):
            workers += [(f"d{len(workers) + k}", profile["step"]) for k in range(pool["count"])]
    if not workers:
        fail(f"{flags['cluster']}: no decode pool")
    max_wait = (cluster.get("admission") or {}).get("max_wait_s")
    free = [0.0] * len(workers)
    seen_groups = set()
    lines = []
    last_arrival = 0.0
    with open(flags["trace"]) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            r = json.loads(line)
            for field in ("id", "arrival_s", "prompt_tokens", "output_tokens"):
                if field not in r:
                    fail(f"{flags['trace']}:{number}: field '{field}' is missing")
            if r["arrival_s"] < last_arrival:
                fail(f"{flags['trace']}:{number}: arrival_s goes back in time")
            last_arrival = r["arrival_s"]
            k = len(lines) % len(workers)
            name, step = workers[k]
            cached = 0
            if r.get("prefix_group") is not None:
                if r["prefix_group"] in seen_groups:
                    cached = r["prefix_tokens"]
                seen_groups.add(r["prefix_group"])
            begin = max(r["arrival_s"], free[k])
            out = {key: r.get(key) for key in ("id", "arrival_s", "slo_class", "tenant",
                                               "ttft_slo_ms", "tpot_slo_ms")}
            out.update(prompt_tokens=r["prompt_tokens"], prefill_worker=None, decode_worker=name,
                       migrated=False)
            if max_wait is not None and begin - r["arrival_s"] > max_wait:
                out.update(ok=False, error="RESOURCE_EXHAUSTED: fake admission shed it",
                           ttft_ms=None, e2e_ms=None, output_tokens=0, cached_tokens=None)
            else:
                prefill = step["base_seconds"] + step["prefill_token_seconds"] * (
                    r["prompt_tokens"] - cached)
                decode = (r["output_tokens"] - 1) * (step["base_seconds"] +
                                                      step["decode_token_seconds"])
                free[k] = begin + prefill + decode
                ttft = begin + prefill - r["arrival_s"]
                out.update(ok=True, error=None, ttft_ms=1e3 * ttft, e2e_ms=1e3 * (ttft + decode),
                           output_tokens=r["output_tokens"], cached_tokens=cached)
            lines.append(json.dumps(out))
    with open(flags["out"], "w") as f:
        f.write("\n".join(lines) + "\n")
    if "summary" in flags:
        print(json.dumps({"requests": len(lines), "simulated_s": max(free + [last_arrival]),
                          "wall_s": time.monotonic() - start, "events": 2 * len(lines),
                          "peak_rss_mb": 0}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
