#!/usr/bin/env python3
"""The simulator's fidelity: a real local cluster against `tandem sim` of the same cluster.

For each placement policy: `tandem up --policy=P` on free ports; `tandem profile --watch_s` of
every worker while the real `tandem bench` sweeps the rates over HTTP (so each profile is fitted
on the steps the worker ran under that traffic); then `tandem sim` of a cluster.json with the
same pools, the captured profiles, the same policy and the same seeded workload. Prints, per
policy and rate, real and simulated SLO attainment (difference in percentage points) and goodput
(difference in % of the real figure), and the load average around each real run.

  .venv/bin/python bench/sim_fidelity.py --out out/fidelity            # everything
  .venv/bin/python bench/sim_fidelity.py --out out/fidelity --sim-only # re-simulate, same files
  .venv/bin/python bench/sim_fidelity.py --out out/f --repeats 3       # each policy 3 times

With --repeats N each policy's real run (and its simulation) is done N times, the k-th with
workload seed --seed + k - 1 and its own cluster and profiles; files are then named by
<policy>.<k> instead of <policy>, and a table pools each policy's repeats per rate (attainment:
met / requests over all of them; goodput: their mean), which halves the real side's sampling
error at 4 repeats.

Files under --out: real-<policy>.json and sim-<policy>.json (the bench's result JSON),
profile-<policy>-<worker>.json, cluster-<policy>.json, cluster-<policy>.log (tandem up's output),
loads.json, fidelity.json (the table). docs/sim.md "Fidelity" has the figures.
"""
import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import threading

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from tandem_bench import cluster  # noqa: E402

POLICIES = ("round_robin", "least_loaded", "kv_aware", "slo")
# The simulations of each real run: the profiles alone, and with the measured step factors.
VARIANTS = ("profile", "factors")
SUFFIX = {"profile": "", "factors": "-factors"}
# A worker's start-up line as `tandem up` echoes it: "[decode-0] ... listening on port P ...".
_WORKER_PORT = re.compile(r"^\[(?P<name>(?:prefill|decode)-\d+)\] .*listening on port (?P<port>\d+)")
# The bounds docs/sim.md states.
ATTAINMENT_BOUND_PP = 5.0
GOODPUT_BOUND_PCT = 10.0


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=pathlib.Path, required=True, help="folder for every file")
    p.add_argument("--bin", type=pathlib.Path,
                   default=pathlib.Path(os.environ.get("TANDEM_BIN_DIR",
                                                       REPO / "build/release/bin")))
    p.add_argument("--policies", default=",".join(POLICIES),
                   help="router policy names, comma-separated (default: all four)")
    p.add_argument("--rates", default="1,2,3,4,6")
    p.add_argument("--num-requests", type=int, default=40)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--ttft-slo-ms", type=float, default=300)
    p.add_argument("--tpot-slo-ms", type=float, default=40)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1,
                   help="real runs (and simulations) of each policy, seeds --seed, --seed + 1, ...")
    p.add_argument("--up", default="", help="more `tandem up` flags, e.g. 'decode_workers=2'")
    p.add_argument("--sim-flags", default="",
                   help="more `tandem sim` flags (space-separated), for trying a correction")
    p.add_argument("--markdown", action="store_true",
                   help="also print the table as Markdown (as docs/sim.md shows it)")
    p.add_argument("--sim-only", action="store_true",
                   help="keep real-*.json and the profiles already in --out; simulate again")
    args = p.parse_args(argv)
    args.policies = [x for x in args.policies.split(",") if x]
    for policy in args.policies:
        if policy not in POLICIES:
            p.error(f"--policies: unknown policy '{policy}' (one of {', '.join(POLICIES)})")
    if args.repeats < 1:
        p.error("--repeats: at least 1")
    return args


class Run:
    """One real run of a policy and its simulations: `key` names its files."""

    def __init__(self, policy, repeat, repeats, seed):
        self.policy = policy
        self.repeat = repeat
        self.seed = seed
        self.key = policy if repeats == 1 else f"{policy}.{repeat}"


def runs_of(args):
    return [Run(policy, k + 1, args.repeats, args.seed + k)
            for policy in args.policies for k in range(args.repeats)]


def workload_flags(args, seed):
    return ["--rates", args.rates, "--num-requests", str(args.num_requests),
            "--input-len", str(args.input_len), "--output-len", str(args.output_len),
            "--ttft-slo-ms", str(args.ttft_slo_ms), "--tpot-slo-ms", str(args.tpot_slo_ms),
            "--seed", str(seed)]


def loadavg():
    return [round(x, 2) for x in os.getloadavg()]


class StepRecorder:
    """Every engine step a worker reports (WatchState's LoadSample.recent_steps), kept while the
    bench runs, so the profile's step model can be checked against the steps themselves."""

    def __init__(self, target):
        from tandem_bench import clients
        import grpc
        p = clients.protos()
        self._channel = grpc.insecure_channel(target)
        stub = p.worker_grpc.WorkerStateStub(self._channel)
        self._call = stub.WatchState(p.worker.WatchStateRequest(subscriber="sim-fidelity",
                                                                load_interval_ms=100))
        self.steps = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        import grpc
        try:
            for update in self._call:
                if update.HasField("load"):
                    for t in update.load.recent_steps:
                        self.steps.append({
                            "batch_size": t.batch_size, "prefill_tokens": t.prefill_tokens,
                            "decode_tokens": t.decode_tokens,
                            # As the router reads a step (StepObservationOf): the context the
                            # decode tokens attended to, and the prompt tokens'.
                            "decode_context": t.attended_tokens - t.prompt_attended_tokens,
                            "prompt_context": t.prompt_attended_tokens,
                            "seconds": t.duration_us * 1e-6})
        except grpc.RpcError:
            pass  # cancelled by stop()

    def stop(self, path):
        self._call.cancel()
        self._thread.join(timeout=10)
        self._channel.close()
        path.write_text("".join(json.dumps(s) + "\n" for s in self.steps))


def run_real(args, run, loads):
    """`tandem up --policy=P`, the bench against it, each worker profiled meanwhile."""
    flags = [f"--policy={run.policy}"] + cluster.parse_up_flags(args.up)
    log = args.out / f"cluster-{run.key}.log"
    log.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO / "bench"))
    with cluster.LocalCluster(args.bin, flags, log_path=log) as up:
        workers = {}
        for line in up.log_tail(5000).splitlines():
            if m := _WORKER_PORT.match(line):
                workers[m.group("name")] = int(m.group("port"))
        if not workers:
            raise SystemExit(f"no worker ports in `tandem up`'s output:\n{up.log_tail()}")
        # The profiles watch about as long as the bench sends (its requests' arrival spans).
        watch_s = sum(args.num_requests / float(r) for r in args.rates.split(",")) + 5
        profilers = {
            name: subprocess.Popen(
                [str(args.bin / "tandem"), "profile", f"--worker=127.0.0.1:{port}",
                 f"--out={args.out / f'profile-{run.key}-{name}.json'}", f"--watch_s={watch_s:.0f}"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for name, port in sorted(workers.items())}
        recorders = {name: StepRecorder(f"127.0.0.1:{port}") for name, port in workers.items()}
        before = loadavg()
        bench = subprocess.run(
            # No warm-up: under the slo policy the router may shed it, which stops the bench.
            [sys.executable, "-m", "tandem_bench", "--url", up.http_url, "--label", f"real {run.key}",
             "--warmup", "0",
             "--result-json", str(args.out / f"real-{run.key}.json"),
             *workload_flags(args, run.seed)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        after = loadavg()
        for name, recorder in recorders.items():
            recorder.stop(args.out / f"steps-{run.key}-{name}.jsonl")
        for name, proc in profilers.items():
            output, _ = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"tandem profile of {name} failed:\n{output}")
        if bench.returncode != 0:
            raise SystemExit(f"tandem bench failed:\n{bench.stdout[-4000:]}")
    loads[run.key] = {"before": before, "after": after}
    return sorted(workers)


def step_ratios(args, key, workers):
    """Measured / predicted seconds of every step the workers ran during the real run (each by
    its own worker's profile), sorted: the spread of real steps around the fitted profile."""
    ratios = []
    for name in workers:
        steps_path = args.out / f"steps-{key}-{name}.jsonl"
        if not steps_path.exists():
            continue
        c = json.loads((args.out / f"profile-{key}-{name}.json").read_text())["step"]
        for line in steps_path.read_text().splitlines():
            s = json.loads(line)
            if s["batch_size"] > 0:
                ratios.append(s["seconds"] / predicted_seconds(c, s))
    return sorted(ratios)


def quantiles(sorted_values, n):
    """n evenly spaced quantiles (the midpoints of n equal shares) of a sorted list."""
    if len(sorted_values) <= n:
        return list(sorted_values)
    return [sorted_values[int((k + 0.5) * len(sorted_values) / n)] for k in range(n)]


def cluster_json(args, run, workers, variant):
    """The simulated twin of `tandem up`: one pool per role, each with its worker's profile;
    variant "factors" adds the measured step_factors (1,000 quantiles of step_ratios)."""
    profiles = {name: json.loads((args.out / f"profile-{run.key}-{name}.json").read_text())
                for name in workers}
    kv_bytes = next((p["kv_bytes_per_token"] for p in profiles.values()
                     if p.get("kv_bytes_per_token")), None)
    pools = []
    for role in ("prefill", "decode"):
        names = [n for n in workers if n.startswith(role + "-")]
        if not names:
            continue
        # Workers of one role run the same settings; the first one's profile stands for them.
        pool = {"role": role if any(n.startswith("prefill-") for n in workers) else "both",
                "count": len(names), "profile": f"profile-{run.key}-{names[0]}.json"}
        if kv_bytes is not None:
            pool["kv_bytes_per_token"] = kv_bytes
        pools.append(pool)
    # `tandem sim` names the router's kv_aware "prefix" (tandem_sim takes both).
    spec = {"policy": "prefix" if run.policy == "kv_aware" else run.policy, "pools": pools}
    if variant == "factors":
        ratios = step_ratios(args, run.key, workers)
        if not ratios:
            raise SystemExit(f"no recorded steps for {run.key} in {args.out}: run the real side")
        spec["step_factors"] = [round(x, 5) for x in quantiles(ratios, 1000)]
    path = args.out / f"cluster-{run.key}{SUFFIX[variant]}.json"
    path.write_text(json.dumps(spec, indent=1) + "\n")
    return path


def run_sim(args, run, variant, cluster_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "bench"), TANDEM_BIN_DIR=str(args.bin))
    name = f"sim-{run.key}{SUFFIX[variant]}"
    sim = subprocess.run(
        [sys.executable, "-m", "tandem_bench.sim", "--cluster", str(cluster_path),
         "--label", name, "--jobs", "2", "--work-dir", str(args.out / name),
         "--result-json", str(args.out / f"{name}.json"), *workload_flags(args, run.seed),
         *args.sim_flags.split()],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if sim.returncode != 0:
        raise SystemExit(f"tandem sim failed:\n{sim.stdout[-4000:]}")


def summaries(path):
    run = json.loads(path.read_text())["runs"][0]
    return {r["rate"]: r["summary"] for r in run["rates"]}


def compare(args, runs, variant):
    rows = []
    for run in runs:
        real = summaries(args.out / f"real-{run.key}.json")
        sim = summaries(args.out / f"sim-{run.key}{SUFFIX[variant]}.json")
        for rate in sorted(real):
            r, s = real[rate], sim[rate]
            att_pp = 100.0 * (s["slo_attainment"] - r["slo_attainment"])
            good_pct = (100.0 * (s["goodput"] - r["goodput"]) / r["goodput"]
                        if r["goodput"] > 0 else None)
            rows.append({
                "policy": run.policy, "repeat": run.repeat, "seed": run.seed, "key": run.key,
                "rate": rate, "sim": variant,
                "real_met": r["slo_met"], "sim_met": s["slo_met"],
                "real_requests": r["requests"], "sim_requests": s["requests"],
                "real_attainment": r["slo_attainment"], "sim_attainment": s["slo_attainment"],
                "attainment_diff_pp": att_pp,
                "real_goodput": r["goodput"], "sim_goodput": s["goodput"],
                "goodput_diff_pct": good_pct,
                "real_ttft_p50_ms": r["ttft_ms"]["p50"], "sim_ttft_p50_ms": s["ttft_ms"]["p50"],
                "real_tpot_p50_ms": r["tpot_ms"]["p50"], "sim_tpot_p50_ms": s["tpot_ms"]["p50"],
                "within": abs(att_pp) <= ATTAINMENT_BOUND_PP and
                          (good_pct is None or abs(good_pct) <= GOODPUT_BOUND_PCT)})
    return rows


def predicted_seconds(c, s):
    """The profile's step seconds (StepProfile::StepSeconds) of a recorded step."""
    return (c["base_seconds"] + c["prefill_token_seconds"] * s["prefill_tokens"] +
            c["decode_token_seconds"] * s["decode_tokens"] +
            c["context_token_seconds"] * s["decode_context"] +
            c["prompt_context_token_seconds"] * s["prompt_context"])


def step_fit(args, key):
    """The profile against the steps recorded during the real run: per batch size, how many
    steps, their median seconds and the median of measured / predicted (1 = the model is right)."""
    out = {}
    for path in sorted(args.out.glob(f"steps-{key}-*.jsonl")):
        name = path.name[len(f"steps-{key}-"):-len(".jsonl")]
        profile_path = args.out / f"profile-{key}-{name}.json"
        if not profile_path.exists():
            continue
        c = json.loads(profile_path.read_text())["step"]
        by_batch = {}
        for line in path.read_text().splitlines():
            s = json.loads(line)
            if s["batch_size"] == 0:
                continue
            predicted = predicted_seconds(c, s)
            kind = "prefill+decode" if s["prefill_tokens"] and s["decode_tokens"] else (
                "prefill" if s["prefill_tokens"] else "decode")
            key = f"{kind} b{min(s['batch_size'], 16)}"
            by_batch.setdefault(key, []).append((s["seconds"], s["seconds"] / predicted))
        out[name] = {k: {"steps": len(v), "seconds_p50": statistics.median(x[0] for x in v),
                         "measured_over_predicted_p50": statistics.median(x[1] for x in v)}
                     for k, v in sorted(by_batch.items())}
    return out


def median_of(values):
    """The median of the values that exist (a rate where nothing succeeded has no TTFT)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ms(value, digits):
    return "-" if value is None else f"{value:.{digits}f}"


def pooled(rows):
    """Per rate, every policy's requests together: attainment = met / requests over all of them,
    goodput the policies' mean. Four runs of 40 requests make a point of 160, whose sampling error
    is half a single run's (where the policies place alike, as on 1 prefill + 1 decode worker
    with short prompts, they are repeats of one experiment)."""
    out = []
    for rate in sorted({x["rate"] for x in rows}):
        at = [x for x in rows if x["rate"] == rate]
        real = sum(x["real_met"] for x in at) / sum(x["real_requests"] for x in at)
        sim = sum(x["sim_met"] for x in at) / sum(x["sim_requests"] for x in at)
        rg = sum(x["real_goodput"] for x in at) / len(at)
        sg = sum(x["sim_goodput"] for x in at) / len(at)
        good = 100.0 * (sg - rg) / rg if rg > 0 else None
        repeats = len({x.get("key", x["policy"]) for x in at})
        names = "+".join(sorted({x["policy"] for x in at}))
        out.append({"policy": names, "key": names if repeats == len(set(names.split("+")))
                    else f"{names} ({repeats} runs)", "rate": rate,
                    "real_attainment": real, "sim_attainment": sim,
                    "attainment_diff_pp": 100.0 * (sim - real), "real_goodput": rg,
                    "sim_goodput": sg, "goodput_diff_pct": good,
                    **{key: median_of(x[key] for x in at)
                       for key in ("real_ttft_p50_ms", "sim_ttft_p50_ms", "real_tpot_p50_ms",
                                   "sim_tpot_p50_ms")},
                    "within": abs(100.0 * (sim - real)) <= ATTAINMENT_BOUND_PP and
                              (good is None or abs(good) <= GOODPUT_BOUND_PCT)})
    return out


def print_table(rows, loads):
    head = ("policy", "rate", "att real", "att sim", "Δ pp", "goodput real", "goodput sim",
            "Δ %", "TTFT p50 r/s", "TPOT p50 r/s", "ok")
    lines = [head]
    for x in rows:
        good = "-" if x["goodput_diff_pct"] is None else f"{x['goodput_diff_pct']:+.1f}"
        lines.append((x.get("key", x["policy"]), f"{x['rate']:g}", f"{100 * x['real_attainment']:.1f}",
                      f"{100 * x['sim_attainment']:.1f}", f"{x['attainment_diff_pp']:+.1f}",
                      f"{x['real_goodput']:.2f}", f"{x['sim_goodput']:.2f}", good,
                      f"{ms(x['real_ttft_p50_ms'], 0)}/{ms(x['sim_ttft_p50_ms'], 0)}",
                      f"{ms(x['real_tpot_p50_ms'], 1)}/{ms(x['sim_tpot_p50_ms'], 1)}",
                      "yes" if x["within"] else "NO"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for i, line in enumerate(lines):
        print("  ".join(cell.rjust(w) for cell, w in zip(line, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    within = sum(x["within"] for x in rows)
    print(f"\nwithin {ATTAINMENT_BOUND_PP:g} pp attainment and {GOODPUT_BOUND_PCT:g}% goodput: "
          f"{within} of {len(rows)} points")


def markdown(rows):
    """The profile and factors rows side by side as a Markdown table (docs/sim.md's)."""
    def pct(x):
        return f"{100 * x:.1f}"
    factors = {(x.get("key", x["policy"]), x["rate"]): x for x in rows.get("factors", [])}
    lines = ["| policy | rate | attainment real | sim (Δ pp) | sim + factors (Δ pp) | goodput real "
             "| sim (Δ %) | sim + factors (Δ %) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for x in rows["profile"]:
        f = factors.get((x.get("key", x["policy"]), x["rate"]))
        def good(y):
            d = y["goodput_diff_pct"]
            return f"{y['sim_goodput']:.2f} ({'-' if d is None else f'{d:+.1f}'})"
        lines.append(
            f"| {x.get('key', x['policy'])} | {x['rate']:g} | {pct(x['real_attainment'])} | "
            f"{pct(x['sim_attainment'])} ({x['attainment_diff_pp']:+.1f}) | " +
            (f"{pct(f['sim_attainment'])} ({f['attainment_diff_pp']:+.1f})" if f else "-") +
            f" | {x['real_goodput']:.2f} | {good(x)} | " + (good(f) if f else "-") + " |")
    return "\n".join(lines)


def repeats_pooled(rows):
    """Each policy's repeats pooled per rate (pooled() over one policy's rows)."""
    return [x for policy in dict.fromkeys(r["policy"] for r in rows)
            for x in pooled([r for r in rows if r["policy"] == policy])]


def main(argv=None):
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    loads_path = args.out / "loads.json"
    loads = json.loads(loads_path.read_text()) if loads_path.exists() else {}
    runs = runs_of(args)
    for run in runs:
        if args.sim_only:
            workers = sorted(p.name[len(f"profile-{run.key}-"):-len(".json")]
                             for p in args.out.glob(f"profile-{run.key}-*.json"))
        else:
            print(f"real {run.key} (seed {run.seed}) ...", flush=True)
            workers = run_real(args, run, loads)
            loads_path.write_text(json.dumps(loads, indent=1) + "\n")
        for variant in VARIANTS:
            if variant == "factors" and not step_ratios(args, run.key, workers):
                print(f"sim {run.key} ({variant}): no recorded steps, skipped", flush=True)
                continue
            print(f"sim {run.key} ({variant}) ...", flush=True)
            run_sim(args, run, variant, cluster_json(args, run, workers, variant))
    rows = {variant: compare(args, [r for r in runs if (
                args.out / f"sim-{r.key}{SUFFIX[variant]}.json").exists()], variant)
            for variant in VARIANTS}
    for variant in VARIANTS:
        if rows[variant]:
            rows[f"{variant}_pooled"] = pooled(rows[variant])
            if args.repeats > 1:
                rows[f"{variant}_repeats"] = repeats_pooled(rows[variant])
    fits = {run.key: step_fit(args, run.key) for run in runs}
    (args.out / "fidelity.json").write_text(json.dumps(
        {"command": sys.argv, "rows": rows, "loads": loads, "step_fit": fits}, indent=1) + "\n")
    for variant in VARIANTS:
        if not rows[variant]:
            continue
        print(f"\nsimulated with {'the profiles alone' if variant == 'profile' else 'the profiles and the measured step factors'}:")
        print_table(rows[variant], {})
        if args.repeats > 1:
            print("\neach policy's repeats pooled per rate (TTFT/TPOT: the median of their medians):")
            print_table(rows[f"{variant}_repeats"], {})
        if len({x["policy"] for x in rows[variant]}) > 1:
            print("\nthe policies pooled per rate (TTFT/TPOT: the median of their medians):")
            print_table(rows[f"{variant}_pooled"], {})
    if args.markdown:
        print()
        print(markdown(rows))
        if args.repeats > 1:
            print()
            print(markdown({"profile": rows["profile_repeats"],
                            "factors": rows.get("factors_repeats", [])}))
        if len({x["policy"] for x in rows["profile"]}) > 1:
            print()
            print(markdown({"profile": rows["profile_pooled"],
                            "factors": rows.get("factors_pooled", [])}))
    for key, load in loads.items():
        if key in {run.key for run in runs}:
            print(f"load average (1, 5, 15 min) around the real {key} run: before "
                  f"{load['before']}, after {load['after']}")


if __name__ == "__main__":
    main()
