"""Two peers' results, reproduced in the simulator (tandem_sim) with real profiles (docs/sim.md,
"Planning"):

  distserve  DistServe (Zhong et al., OSDI 2024): under tight TTFT and TPOT objectives,
             disaggregating prefill and decode raises goodput (the highest rate at which 90% of
             requests meet both) over the same number of aggregated workers. Here: N workers of a
             profile, aggregated (N doing both) against every prefill:decode split of N, goodput
             per configuration from a rate sweep.
  alpaserve  AlpaServe (Li et al., OSDI 2023): pooling capacity across bursty streams raises SLO
             attainment. Here: two tenants, each with bursty Gamma arrivals (CV = 1/sqrt(shape)),
             served by one shared pool of N workers against two dedicated pools of N/2, the same
             requests and arrival times, attainment over a rate sweep.

  .venv/bin/python bench/planning_peers.py --profile cpu=bench/profiles/cpu_smollm2_135m.json \\
      --profile h200=bench/profiles/h200_llama8b_roofline.json --out out/peers.json --plot-dir out

Each simulation is its own tandem_sim process, --jobs at once. Prints a table per experiment and
writes the figures as JSON (and PNGs with --plot-dir).
"""
import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from tandem_bench import arrivals, cluster, metrics, plots, sim, workload  # noqa: E402

# The workload (--prompt, --output; lengths uniform within +-50%) and its objectives, as multiples
# of one request's unloaded TTFT and TPOT on one worker (DistServe's "SLO scale"), so that one
# definition fits a CPU worker and an H200.
WORKLOADS = {"default": (512, 64, 3.0, 1.5)}


LINKS = {}  # profile name -> link bandwidth, Gb/s (NAME=FILE:GBPS)


def simulate(sim_path, directory, cluster_json, lines, seed=0):
    """tandem_sim --summary on (cluster, trace lines): its summary dict."""
    directory.mkdir(parents=True, exist_ok=True)
    if cluster_json.get("profile_name") in LINKS:
        cluster_json = dict(cluster_json, links={"bandwidth_gbps": LINKS[cluster_json["profile_name"]],
                                                 "latency_us": 10})
    cluster_json = {k: v for k, v in cluster_json.items() if k != "profile_name"}
    (directory / "cluster.json").write_text(json.dumps(cluster_json))
    (directory / "trace.jsonl").write_text("\n".join(lines) + "\n")
    out = subprocess.run([str(sim_path), f"--cluster={directory / 'cluster.json'}",
                          f"--trace={directory / 'trace.jsonl'}", f"--seed={seed}", "--summary"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"tandem_sim failed on {directory}: {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def pools(profile, shape):
    """cluster.json pools: shape is ("both", n) or ("split", p, d)."""
    base = {k: profile[k] for k in ("max_running", "token_budget", "kv_blocks", "block_size")}
    # A captured decode worker's local-prefill cap is that role's setting; here every worker may
    # prefill a whole budget per step.
    base["max_prefill_tokens"] = 0
    if shape[0] == "both":
        return [dict(base, role="both", count=shape[1], profile=profile)]
    p, d = shape[1], shape[2]
    return ([dict(base, role="prefill", count=p, profile=profile)] if p else []) + \
        [dict(base, role="decode", count=d, profile=profile)]


def label(shape):
    return f"{shape[1]}x both" if shape[0] == "both" else f"{shape[1]}P+{shape[2]}D"


def trace(config, seed, rate, n, burstiness=1.0, stream="a", tenant=None, offset=0):
    kind = "gamma" if burstiness != 1.0 else "poisson"
    times = arrivals.schedule(arrivals.ArrivalProcess(kind, rate, burstiness),
                              arrivals.rng_for(seed, "arrivals", stream), num_requests=n)
    specs = workload.build(config, seed, n, stream=stream, text=False)
    out = []
    for spec, at, line in zip(specs, times, sim.trace_lines(specs, times)):
        entry = json.loads(line)
        entry["id"] = f"{stream}{spec.index + offset}"
        if tenant:
            entry["tenant"] = tenant
        out.append((at, entry))
    return out


def lines_of(entries):
    return [json.dumps(e) for _, e in sorted(entries, key=lambda x: x[0])]


def unloaded(sim_path, work, profile, prompt, output):
    """One request alone on one aggregated worker: (TTFT ms, TPOT ms)."""
    c = {"policy": "round_robin", "pools": pools(profile, ("both", 1))}
    entry = {"id": "u", "arrival_s": 0.0, "prompt_tokens": prompt, "output_tokens": output}
    s = simulate(sim_path, work / "unloaded", c, [json.dumps(entry)])
    return s["ttft_ms_p50"], s["tpot_ms_p50"]


@dataclasses.dataclass
class SloWorkload:
    """The default workload, its SLOs scaled from one request alone on one worker."""
    prompt: int
    output: int
    ttft0: float        # unloaded TTFT, ms
    tpot0: float        # unloaded TPOT, ms
    slo: dict
    config: workload.WorkloadConfig
    one: float          # requests per second one worker serves alone


def slo_workload(sim_path, work, profile):
    prompt, output, ttft_scale, tpot_scale = WORKLOADS["default"]
    ttft0, tpot0 = unloaded(sim_path, work, profile, prompt, output)
    slo = {"ttft_ms": ttft_scale * ttft0, "tpot_ms": tpot_scale * tpot0}
    config = workload.WorkloadConfig(input_lengths=workload.Lengths(prompt, 0.5),
                                     output_lengths=workload.Lengths(output, 0.5),
                                     ttft_slo_ms=slo["ttft_ms"], tpot_slo_ms=slo["tpot_ms"])
    return SloWorkload(prompt, output, ttft0, tpot0, slo, config,
                       one=1000.0 / (ttft0 + output * tpot0))


def distserve(sim_path, work, name, profile, workers, pool, jobs_rates, seed):
    w = slo_workload(sim_path, work / name, profile)
    # Rates: around what one worker does alone per second, times the workers.
    rates = [workers * w.one * f for f in jobs_rates]
    shapes = [("both", workers)] + [("split", p, workers - p) for p in range(1, workers)]
    futures = {}
    for shape in shapes:
        for k, rate in enumerate(rates):
            entries = trace(w.config, seed, rate, 400, stream=f"r{k}")
            c = {"policy": "slo", "pools": pools(profile, shape), "profile_name": name}
            futures[(label(shape), k)] = pool.submit(
                simulate, sim_path, work / name / f"{label(shape)}-{k}".replace("+", "_"), c,
                lines_of(entries), seed)
    rows = []
    for shape in shapes:
        att = [futures[(label(shape), k)].result()["slo_attainment"] for k in range(len(rates))]
        rows.append({"config": label(shape), "rates": rates, "attainments": att,
                     "goodput": metrics.distserve_goodput(rates, att, 0.9)})
    return {"profile": name, "workers": workers, "prompt": w.prompt, "output": w.output,
            "unloaded_ttft_ms": w.ttft0, "unloaded_tpot_ms": w.tpot0, "slo": w.slo, "rows": rows}


def alpaserve(sim_path, work, name, profile, workers, pool, jobs_rates, seed, burstiness):
    w = slo_workload(sim_path, work / name, profile)
    rates = [workers * w.one * f / 2 for f in jobs_rates]   # per tenant
    half = workers // 2
    futures = {}
    for k, rate in enumerate(rates):
        a = trace(w.config, seed, rate, 300, burstiness, stream=f"a{k}", tenant="a")
        b = trace(w.config, seed + 1, rate, 300, burstiness, stream=f"b{k}", tenant="b")
        shared = {"policy": "slo", "pools": pools(profile, ("both", workers))}
        dedicated = {"policy": "slo", "pools": pools(profile, ("both", half))}  # no transfers
        d = work / name / f"alpa-{k}"
        futures[("shared", k)] = pool.submit(simulate, sim_path, d / "shared", shared,
                                             lines_of(a + b), seed)
        futures[("a", k)] = pool.submit(simulate, sim_path, d / "a", dedicated, lines_of(a), seed)
        futures[("b", k)] = pool.submit(simulate, sim_path, d / "b", dedicated, lines_of(b), seed)
    shared, dedicated = [], []
    for k in range(len(rates)):
        shared.append(futures[("shared", k)].result()["slo_attainment"])
        sa, sb = futures[("a", k)].result(), futures[("b", k)].result()
        dedicated.append((sa["slo_attainment"] * sa["requests"] + sb["slo_attainment"] *
                          sb["requests"]) / (sa["requests"] + sb["requests"]))
    return {"profile": name, "workers": workers, "burstiness": burstiness,
            "cv": 1 / math.sqrt(burstiness), "slo": w.slo, "total_rates": [2 * r for r in rates],
            "rows": [{"config": f"shared {workers}x both", "attainments": shared,
                      "goodput": metrics.distserve_goodput([2 * r for r in rates], shared, 0.9)},
                     {"config": f"dedicated 2 x {half}x both", "attainments": dedicated,
                      "goodput": metrics.distserve_goodput([2 * r for r in rates], dedicated,
                                                           0.9)}]}


def plot(rows, rates, path):
    """Attainment versus rate of an experiment's rows, rates[i] those of rows[i]."""
    runs = [{"label": row["config"], "distserve_goodput": row["goodput"],
             "rates": [{"rate": x, "summary": {"slo_attainment": a}}
                       for x, a in zip(row_rates, row["attainments"])]}
            for row, row_rates in zip(rows, rates)]
    plots.attainment_vs_rate(runs, path, 0.9)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", action="append", required=True, metavar="NAME=FILE[:GBPS]",
                   help="a worker profile (tandem profile), repeatable; GBPS: the KV link's "
                        "bandwidth between its workers (default tandem_sim's 10 Gb/s)")
    p.add_argument("--workers", type=int, default=4, help="workers of each configuration")
    p.add_argument("--burstiness", type=float, default=0.25,
                   help="Gamma shape of each tenant's arrivals (0.25: CV 2)")
    p.add_argument("--scales", default="0.25,0.5,0.75,1,1.25,1.5,2,2.5,3",
                   help="rates as multiples of N unloaded workers' request rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=3,
                   help="runs with seeds --seed, --seed+1, ...: goodput is their median")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--bin", type=pathlib.Path, default=None)
    p.add_argument("--out", type=pathlib.Path, help="the figures as JSON")
    p.add_argument("--plot-dir", type=pathlib.Path)
    p.add_argument("--prompt", type=int, default=512, help="mean prompt tokens")
    p.add_argument("--output", type=int, default=64, help="mean output tokens")
    p.add_argument("--ttft-scale", type=float, default=3.0,
                   help="TTFT objective = this x one request's unloaded TTFT")
    p.add_argument("--tpot-scale", type=float, default=1.5,
                   help="TPOT objective = this x one request's unloaded TPOT")
    p.add_argument("--experiments", default="distserve,alpaserve")
    args = p.parse_args(argv)
    WORKLOADS["default"] = (args.prompt, args.output, args.ttft_scale, args.tpot_scale)
    sim_path = sim.simulator_path(args.bin or cluster.default_bin_dir())
    scales = [float(x) for x in args.scales.split(",")]
    profiles = {}
    for item in args.profile:
        name, _, path = item.partition("=")
        path, _, gbps = path.partition(":")
        if gbps:
            LINKS[name] = float(gbps)
        profiles[name] = sim.check_profile(sim.load_json(path, "profile"), path)
    results = {"distserve": [], "alpaserve": []}
    seeds = [args.seed + k for k in range(args.seeds)]
    with tempfile.TemporaryDirectory(prefix="peers-") as scratch, \
            concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        work = pathlib.Path(scratch)
        for name, profile in profiles.items():
            for experiment, run in (("distserve", distserve), ("alpaserve", alpaserve)):
                if experiment not in args.experiments:
                    continue
                extra = (args.burstiness,) if experiment == "alpaserve" else ()
                per_seed = [run(sim_path, work / f"s{seed}", name, profile, args.workers, pool,
                                scales, seed, *extra) for seed in seeds]
                first = per_seed[0]
                first["seeds"] = seeds
                for i, row in enumerate(first["rows"]):
                    values = [r["rows"][i]["goodput"]["goodput"] for r in per_seed]
                    row["goodput_by_seed"] = values
                    known = sorted(v for v in values if v is not None)
                    row["goodput_median"] = (statistics.median(values)
                                             if len(known) == len(values) else None)
                results[experiment].append(first)

    def goodputs(row):
        m = row["goodput_median"]
        by_seed = " ".join("-" if v is None else f"{v:.3g}" for v in row["goodput_by_seed"])
        return f"{'-' if m is None else f'{m:.4g}':>8} ({by_seed})"

    for r in results["distserve"]:
        print(f"\nDistServe shape, {r['profile']}: {r['workers']} workers, prompt ~{r['prompt']} "
              f"output ~{r['output']}, TTFT <= {r['slo']['ttft_ms']:.4g} ms, TPOT <= "
              f"{r['slo']['tpot_ms']:.4g} ms (unloaded {r['unloaded_ttft_ms']:.4g} / "
              f"{r['unloaded_tpot_ms']:.4g} ms); goodput = median over seeds {r['seeds']}")
        print(f"  {'config':<12} {'goodput req/s (by seed)':<30} attainment % by rate, seed "
              f"{r['seeds'][0]}")
        for row in r["rows"]:
            print(f"  {row['config']:<12} {goodputs(row):<30} " +
                  " ".join(f"{100 * a:.0f}" for a in row["attainments"]))
        print("  rates: " + " ".join(f"{x:.3g}" for x in r["rows"][0]["rates"]))
    for r in results["alpaserve"]:
        print(f"\nAlpaServe shape, {r['profile']}: two tenants, Gamma arrivals CV {r['cv']:.2g}, "
              f"{r['workers']} workers shared vs 2 x {r['workers'] // 2} dedicated; goodput = "
              f"median over seeds {r['seeds']}")
        for row in r["rows"]:
            print(f"  {row['config']:<24} {goodputs(row):<30} " +
                  " ".join(f"{100 * a:.0f}" for a in row["attainments"]))
        print("  total rates: " + " ".join(f"{x:.3g}" for x in r["total_rates"]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    if args.plot_dir:
        args.plot_dir.mkdir(parents=True, exist_ok=True)
        for r in results["distserve"]:
            plot(r["rows"], [row["rates"] for row in r["rows"]],
                 args.plot_dir / f"distserve_{r['profile']}.png")
        for r in results["alpaserve"]:
            plot(r["rows"], [r["total_rates"]] * len(r["rows"]),
                 args.plot_dir / f"alpaserve_{r['profile']}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
