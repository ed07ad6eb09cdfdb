"""`tandem sim` / `python -m tandem_bench.sim`: tandem bench's workloads on the simulator.

The same load, workload and SLO flags as `tandem bench` make the same seeded requests and arrival
times; instead of being sent to a cluster they are written as a trace (trace.jsonl), the cluster
is described as cluster.json (from flags, or --cluster=FILE), and the simulator
(`<bin>/tandem_sim`, sim/) turns them into results.jsonl. Those are read back into the records a
real run has, and the same metrics.summarize, tables, result JSON and plots follow, so a simulated
and a real run compare line by line. The file formats are docs/sim.md's ("The files").

Every (configuration, rate) pair is its own simulator process; up to --jobs run at once.
"""
import argparse
import concurrent.futures
import copy
import datetime
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile

from . import argtypes, cli, clients, cluster, metrics, runner, workload

SIMULATOR = "tandem_sim"
POLICIES = ("slo", "round_robin", "least_loaded", "prefix")
PROFILE_FORMAT = "tandem-profile-v1"

DESCRIPTION = """\
Simulates a Tandem cluster under `tandem bench`'s workloads: the same arrival processes, length
distributions, datasets, shared prefixes, SLO classes, tenants and rate sweeps, run on the
discrete-event simulator (tandem_sim) with step times from a worker profile (`tandem profile`).
Prints the same tables and writes the same result JSON and plots as `tandem bench`."""

EPILOG = """\
examples:
  # 1 prefill + 4 decode workers of a measured profile, a sweep with SLOs
  tandem sim --profile p.json --prefill-workers 1 --decode-workers 4 --rates 2,4,8 \\
      --duration 60 --ttft-slo-ms 500 --tpot-slo-ms 50 --result-json out/sim.json --plot-dir out
  # two placement policies on a shared-prefix workload, side by side
  tandem sim --profile p.json --decode-workers 8 --ab policy=round_robin policy=prefix \\
      --shared-prefix 8,16,512 --input-len 64 --rates 4,8
  # a cluster file (pools, links, failures) of your own
  tandem sim --cluster cluster.json --rates 1,2,4 --num-requests 2000

docs/sim.md describes the flags, the files and the simulator; docs/bench.md every figure."""


class SimError(Exception):
    """A cluster, profile or simulator problem, with a message that names the file or flag."""


# ------------------------------------------------------------------------------------------------
# Flags.
# ------------------------------------------------------------------------------------------------


_nonneg_int = argtypes.number(int, lambda value: value >= 0, ">= 0")
_nonneg_float = argtypes.number(float, lambda value: 0 <= value < math.inf, "a finite number >= 0")


def _failure(text):
    at, sep, worker = text.partition(":")
    try:
        at_s = float(at)
    except ValueError:
        at_s = math.nan
    if not sep or not worker or not at_s >= 0 or math.isinf(at_s):
        raise argparse.ArgumentTypeError(f"'{text}' is not AT_S:WORKER (e.g. 30:d3)")
    return {"at_s": at_s, "worker": worker}


def _flag(g, name, **kwargs):
    """A flag spelled with dashes and, as `tandem up` spells it, with underscores."""
    g.add_argument(f"--{name}", f"--{name.replace('-', '_')}", **kwargs)


def add_cluster_args(p):
    """The cluster's shape: what --ab's sides override (as name=value)."""
    g = p.add_argument_group("simulated cluster (or --cluster FILE)")
    _flag(g, "cluster", type=pathlib.Path, metavar="FILE",
          help="cluster.json (docs/sim.md); not with the flags below")
    _flag(g, "profile", type=pathlib.Path, metavar="FILE",
          help="the workers' profile.json (`tandem profile`); needed without --cluster")
    _flag(g, "prefill-workers", type=_nonneg_int, default=None, metavar="N",
          help="prefill workers (default 1, as `tandem up`)")
    _flag(g, "decode-workers", type=_nonneg_int, default=None, metavar="N",
          help="decode workers (default 1, as `tandem up`)")
    g.add_argument("--aggregated", action="store_true", default=None,
                   help="no prefill pool: --decode-workers workers that do both (role \"both\")")
    _flag(g, "policy", choices=POLICIES, default=None,
          help="the router's placement policy (default slo)")
    for name, what in (("kv-blocks", "KV blocks per worker"),
                       ("block-size", "tokens per KV block"),
                       ("max-running", "most sequences a worker runs at once"),
                       ("token-budget", "most tokens per engine step"),
                       ("max-prefill-tokens", "most prompt tokens per step (0: no cap)")):
        _flag(g, name, type=_nonneg_int, default=None, metavar="N",
              help=f"{what} (default: the profile's)")
    _flag(g, "link-bandwidth-gbps", type=argtypes.positive(float), default=None, metavar="GBPS",
          help="KV transfer bandwidth between two workers (default 10)")
    _flag(g, "link-latency-us", type=_nonneg_float, default=None, metavar="US",
          help="KV transfer latency between two workers (default 50)")
    _flag(g, "step-noise", type=_nonneg_float, default=None, metavar="F",
          help="multiplicative jitter of step times, seeded (default 0)")
    g.add_argument("--fail", action="append", default=None, type=_failure, metavar="AT_S:WORKER",
                   help="worker WORKER (p0.., d0..) dies at AT_S simulated seconds (repeatable)")
    return g


CLUSTER_DESTS = ("cluster", "profile", "prefill_workers", "decode_workers", "aggregated",
                 "policy", "kv_blocks", "block_size", "max_running", "token_budget",
                 "max_prefill_tokens", "link_bandwidth_gbps", "link_latency_us", "step_noise",
                 "fail")


def build_parser():
    p = argparse.ArgumentParser(prog="tandem sim", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=cli._Formatter)
    add_cluster_args(p)
    g = p.add_argument_group("simulator")
    g.add_argument("--ab", nargs=2, metavar=("A", "B"),
                   help="compare two clusters: the flags above plus A, then plus B, each as "
                        "name=value (e.g. --ab policy=round_robin policy=prefix, or "
                        "--ab cluster=a.json cluster=b.json)")
    add_simulator_args(g, jobs="simulator processes run at once (one per configuration and rate)",
                       work_dir="keep each run's cluster.json, trace.jsonl and results.jsonl here "
                                "(default: a temporary folder, removed)")
    cli.add_workload_args(p, live=False)
    return p


def add_simulator_args(g, jobs, work_dir):
    """--bin, --jobs and --work-dir (shared with `tandem plan`); `jobs` and `work_dir` are their
    help."""
    g.add_argument("--bin", type=pathlib.Path, default=None, metavar="DIR",
                   help=f"where {SIMULATOR} is (default: $TANDEM_BIN_DIR, else "
                        "<repo>/build/release/bin)")
    g.add_argument("--jobs", type=argtypes.positive(int), default=os.cpu_count() or 1, metavar="N",
                   help=jobs)
    g.add_argument("--work-dir", type=pathlib.Path, metavar="DIR", help=work_dir)


def _cluster_parser():
    """A parser of the cluster flags alone, for the sides of --ab."""
    p = argparse.ArgumentParser(prog="tandem sim --ab", add_help=False)
    add_cluster_args(p)
    return p


# ------------------------------------------------------------------------------------------------
# cluster.json and profile.json.
# ------------------------------------------------------------------------------------------------


def load_json(path, what):
    path = pathlib.Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SimError(f"{what} '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SimError(f"cannot read {what} '{path}': {error}") from None
    except json.JSONDecodeError as error:
        raise SimError(f"{what} '{path}': not valid JSON: {error}") from None


STEP_TERMS = ("base_seconds", "prefill_token_seconds", "decode_token_seconds",
              "context_token_seconds", "prompt_context_token_seconds")


def check_profile(profile, where):
    """Raises SimError unless `profile` is a tandem-profile-v1 object whose step coefficients are
    all finite numbers >= 0 (what the router's ValidateProfile asks)."""
    if not isinstance(profile, dict) or profile.get("format") != PROFILE_FORMAT:
        raise SimError(f"{where}: not a profile (expected \"format\": \"{PROFILE_FORMAT}\")")
    step = profile.get("step")
    if not isinstance(step, dict):
        raise SimError(f"{where}: 'step' must be an object of the step model's coefficients")
    for term in STEP_TERMS:
        value = step.get(term)
        if (not isinstance(value, (int, float)) or isinstance(value, bool)
                or not math.isfinite(value) or value < 0):
            raise SimError(f"{where}: step.{term} must be a finite number >= 0, not {value!r}")
    return profile


def cluster_from_flags(ns):
    """cluster.json (a dict) for the cluster flags in `ns`; the profile is inlined, so the file
    says everything about the run."""
    if ns.cluster is not None:
        shape = [d for d in CLUSTER_DESTS if d != "cluster" and getattr(ns, d) is not None]
        if shape:
            raise SimError(f"--cluster describes the whole cluster; it cannot be combined with "
                           f"--{shape[0].replace('_', '-')}")
        data = load_json(ns.cluster, "cluster file")
        if not isinstance(data, dict) or not isinstance(data.get("pools"), list) or not data["pools"]:
            raise SimError(f"cluster file '{ns.cluster}': expected an object with a non-empty "
                           "\"pools\" array")
        if data.get("policy", "slo") not in POLICIES:
            raise SimError(f"cluster file '{ns.cluster}': policy '{data.get('policy')}' is not "
                           f"one of {', '.join(POLICIES)}")
        base = ns.cluster.resolve().parent
        for i, pool in enumerate(data["pools"]):
            if not isinstance(pool, dict):
                raise SimError(f"cluster file '{ns.cluster}': pools[{i}] must be an object")
            if isinstance(pool.get("profile"), str):
                # Relative to the cluster file, wherever the simulator runs.
                pool["profile"] = str((base / pool["profile"]).resolve())
        return data
    if ns.profile is None:
        raise SimError("give the workers' speed with --profile FILE (`tandem profile` writes "
                       "one, from a running worker or --roofline) or the whole cluster with "
                       "--cluster FILE")
    profile = check_profile(load_json(ns.profile, "profile"), f"profile '{ns.profile}'")
    settings = {}
    for dest in ("max_running", "token_budget", "max_prefill_tokens", "kv_blocks", "block_size"):
        value = getattr(ns, dest)
        if value is None:
            value = profile.get(dest)
        if value is None and dest == "max_prefill_tokens":
            value = 0
        if value is None:
            raise SimError(f"the profile '{ns.profile}' has no {dest}: give "
                           f"--{dest.replace('_', '-')}")
        if dest != "max_prefill_tokens" and value < 1:
            raise SimError(f"--{dest.replace('_', '-')} must be >= 1")
        settings[dest] = value
    decode = 1 if ns.decode_workers is None else ns.decode_workers
    if ns.aggregated:
        if ns.prefill_workers:
            raise SimError("--aggregated has no prefill pool: leave out --prefill-workers")
        if decode < 1:
            raise SimError("--aggregated needs --decode-workers >= 1")
        pools = [{"role": "both", "count": decode}]
    else:
        prefill = 1 if ns.prefill_workers is None else ns.prefill_workers
        if decode < 1:
            raise SimError("--decode-workers must be >= 1 (every request decodes somewhere)")
        pools = ([{"role": "prefill", "count": prefill}] if prefill else []) + \
            [{"role": "decode", "count": decode}]
    for pool in pools:
        pool.update({"profile": profile}, **settings)
    return {
        "policy": ns.policy or "slo",
        "pools": pools,
        "links": {"bandwidth_gbps": ns.link_bandwidth_gbps or 10.0,
                  "latency_us": 50.0 if ns.link_latency_us is None else ns.link_latency_us},
        "failures": list(ns.fail or []),
        "step_noise": ns.step_noise or 0.0,
    }


def configurations(args):
    """[(label, cluster dict)]: one, or the two sides of --ab (the base flags plus each side's)."""
    if not args.ab:
        label = args.label or (f"sim {args.cluster.name}" if args.cluster else "sim")
        return [(label, cluster_from_flags(args))]
    out = []
    parser = _cluster_parser()
    for text in args.ab:
        ns = copy.copy(args)
        try:
            tokens = cluster.parse_up_flags(text)
        except ValueError as error:
            raise SimError(f"--ab '{text}': {error}") from None
        # The base flags stay, each side's replace them (a side's --cluster replaces them all).
        if any(t.startswith(("--cluster=", "--cluster ")) for t in tokens):
            for dest in CLUSTER_DESTS:
                setattr(ns, dest, None)
        try:
            parser.parse_args(tokens, namespace=ns)
        except SystemExit:
            raise SimError(f"--ab '{text}': not cluster flags of `tandem sim` (name=value, e.g. "
                           "policy=prefix decode_workers=4)") from None
        out.append((text.strip() or "default", cluster_from_flags(ns)))
    return out


# ------------------------------------------------------------------------------------------------
# The trace, the simulator, the results.
# ------------------------------------------------------------------------------------------------


def request_id(index):
    return f"r{index}"


def trace_lines(specs, times):
    """The trace (docs/sim.md): one JSON object per request, in arrival order."""
    lines = []
    for spec, at in zip(specs, times):
        entry = {"id": request_id(spec.index), "arrival_s": at, "prompt_tokens": spec.input_len,
                 "output_tokens": spec.output_len, "prefix_group": None, "prefix_tokens": None,
                 "slo_class": spec.slo_class, "priority": spec.priority, "tenant": spec.tenant}
        if spec.prefix_group is not None:
            entry["prefix_group"] = f"g{spec.prefix_group}"
            entry["prefix_tokens"] = len(spec.system.split())
        if spec.ttft_slo_ms is not None:
            entry["ttft_slo_ms"] = spec.ttft_slo_ms
        if spec.tpot_slo_ms is not None:
            entry["tpot_slo_ms"] = spec.tpot_slo_ms
        lines.append(json.dumps(entry, allow_nan=False))
    return lines


def simulator_path(bin_dir):
    path = pathlib.Path(bin_dir or cluster.default_bin_dir()) / SIMULATOR
    if not os.access(path, os.X_OK):
        raise SimError(f"the simulator {path} is missing: build it (cmake --build --preset "
                       f"release --target {SIMULATOR}) or name its folder with --bin")
    return path


def simulate(sim, directory, cluster_json, specs, times, seed):
    """Runs the simulator on one trace in `directory`; returns (results by id, its summary)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cluster.json").write_text(json.dumps(cluster_json, indent=1) + "\n")
    (directory / "trace.jsonl").write_text("\n".join(trace_lines(specs, times)) + "\n")
    out = directory / "results.jsonl"
    command = [str(sim), f"--cluster={directory / 'cluster.json'}",
               f"--trace={directory / 'trace.jsonl'}", f"--out={out}", f"--seed={seed}",
               "--summary"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SimError(f"{SIMULATOR} failed (exit {result.returncode}) on {directory}: "
                       f"{result.stderr.strip() or result.stdout.strip()}")
    summary = None
    for line in reversed(result.stdout.splitlines()):
        if line.strip().startswith("{"):
            try:
                summary = json.loads(line)
            except json.JSONDecodeError:
                summary = None
            break
    return read_results(out, {request_id(s.index) for s in specs}), summary


def read_results(path, ids):
    """{id: result line} of results.jsonl; SimError (naming the line) for a malformed line, an
    unknown or repeated id, or a request with no line."""
    by_id = {}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SimError(f"{SIMULATOR} wrote no results: {error}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as error:
            raise SimError(f"{where}: not valid JSON: {error}") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("ok"), bool):
            raise SimError(f"{where}: expected an object with a boolean 'ok'")
        rid = entry.get("id")
        if rid not in ids:
            raise SimError(f"{where}: id {rid!r} is not a request of the trace")
        if rid in by_id:
            raise SimError(f"{where}: id {rid!r} appears twice")
        if entry["ok"]:
            for key in ("ttft_ms", "e2e_ms"):
                value = entry.get(key)
                if not isinstance(value, (int, float)) or not value >= 0:
                    raise SimError(f"{where}: a successful request needs {key} >= 0, not "
                                   f"{value!r}")
        by_id[rid] = entry
    missing = sorted(ids - by_id.keys(), key=lambda r: int(r[1:]))
    if missing:
        raise SimError(f"{path}: no result for {len(missing)} request(s), the first {missing[0]}")
    return by_id


def _seconds(ms):
    return None if ms is None else ms / 1000.0


def record(spec, result, arrival_s, rate):
    """The record a real run has for this request (runner.record), from its simulated result."""
    ok = result["ok"]
    outcome = clients.Outcome(
        ok=ok, error=None if ok else (result.get("error") or "failed in the simulator"),
        status=None if ok else (result.get("error") or "").split(":", 1)[0] or None,
        ttft_s=_seconds(result.get("ttft_ms")), e2e_s=_seconds(result.get("e2e_ms")),
        itl_s=[x / 1000.0 for x in (result.get("itl_ms") or [])],
        output_tokens=result.get("output_tokens") or 0 if ok else 0,
        output_tokens_source="simulator",
        prompt_tokens=result.get("prompt_tokens"),
        cached_prompt_tokens=result.get("cached_tokens"),
        finish_reason="length" if ok else "error",
        decode_worker=result.get("decode_worker"), prefill_worker=result.get("prefill_worker"))
    out = runner.record(spec, outcome, arrival_s, arrival_s, rate)
    out["migrated"] = bool(result.get("migrated"))
    if result.get("preemptions") is not None:
        out["preemptions"] = result["preemptions"]
    return out


def duration_s(records):
    """From the first arrival to the last answer (a failed request ends when it arrives, or
    after its e2e_ms when the simulator gives one)."""
    start = min(r["sent_s"] for r in records)
    end = max(r["sent_s"] + (r["e2e_ms"] or 0.0) / 1000.0 for r in records)
    return end - start


def prefix_hit(records):
    """The prefix-hit figure of a real run, from the simulated cached tokens: cached / prompt
    tokens over the successful requests, per decode worker too."""
    workers = {}
    hits = prompts = 0
    for r in records:
        if not r["ok"] or r.get("cached_prompt_tokens") is None:
            continue
        h, p = r["cached_prompt_tokens"], r["prompt_tokens"] or 0
        hits += h
        prompts += p
        w = workers.setdefault(r.get("decode_worker") or "?", {"role": "decode", "hit_tokens": 0,
                                                              "prompt_tokens": 0})
        w["hit_tokens"] += h
        w["prompt_tokens"] += p
    for w in workers.values():
        w["rate"] = w["hit_tokens"] / w["prompt_tokens"] if w["prompt_tokens"] else None
    return {"rate": hits / prompts if prompts else None, "hit_tokens": hits,
            "prompt_tokens": prompts, "workers": workers, "source": "simulator"}


# ------------------------------------------------------------------------------------------------
# The whole run.
# ------------------------------------------------------------------------------------------------


class Sim:
    """One invocation: the checked flags, the configurations and the simulator."""

    def __init__(self, args, config, rates, kind, sim_path, work_dir):
        self.args = args
        self.config = config
        self.rates = rates
        self.kind = kind
        self.sim = sim_path
        self.work_dir = work_dir
        self.slo_targets = None

    def _points(self):
        """(k, rate, specs, times) of each rate of the sweep: exactly what `tandem bench` sends."""
        return [(k, rate, *cli.sweep_point(self.args, self.config, self.kind, k, rate,
                                           text=False))
                for k, rate in enumerate(self.rates)]

    def _unloaded(self, pool, configs):
        """--slo-scale: each of the workload's `unloaded` requests simulated alone, on the first
        configuration (its own process each); sets self.slo_targets from their medians."""
        args = self.args
        label, cluster_json = configs[0]
        specs = workload.build(self.config, args.seed, args.unloaded_requests, stream="unloaded",
                               text=False)
        futures = [pool.submit(simulate, self.sim, self.work_dir / f"unloaded{i}", cluster_json,
                               [s], [0.0], args.seed) for i, s in enumerate(specs)]
        recs = [record(s, f.result()[0][request_id(s.index)], 0.0, 0.0)
                for s, f in zip(specs, futures)]
        ok = [r for r in recs if r["ok"]]
        figures = {"requests": len(recs), "failed": len(recs) - len(ok),
                   "ttft_ms": cli._median([r["ttft_ms"] for r in ok]),
                   "tpot_ms": cli._median([r["tpot_ms"] for r in ok if r["tpot_ms"] is not None])}
        if figures["ttft_ms"] is None:
            raise SimError("no unloaded request succeeded in the simulator, so --slo-scale has "
                           f"nothing to scale; first error: {recs[0]['error']}")
        self.slo_targets = {
            "scale": args.slo_scale, "measured_on": label, "ttft_ms": args.slo_scale * figures["ttft_ms"],
            "tpot_ms": (args.slo_scale * figures["tpot_ms"] if figures["tpot_ms"] is not None
                        else None)}
        return figures

    def run(self, configs):
        args = self.args
        points = self._points()
        runs = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            unloaded = self._unloaded(pool, configs) if args.slo_scale is not None else None
            if self.slo_targets is not None:
                points = [(k, rate, workload.with_slo_defaults(specs, self.slo_targets["ttft_ms"],
                                                               self.slo_targets["tpot_ms"]), times)
                          for k, rate, specs, times in points]
            jobs = {}
            for c, (label, cluster_json) in enumerate(configs):
                for k, rate, specs, times in points:
                    jobs[(c, k)] = pool.submit(simulate, self.sim, self.work_dir / f"c{c}-r{k}",
                                               cluster_json, specs, times, args.seed)
            for c, (label, cluster_json) in enumerate(configs):
                run = {"label": label, "target": str(self.sim), "protocol": "simulated",
                       "endpoint": None, "up_flags": None, "worker_metrics": {},
                       # A simulated worker starts warm: nothing to warm up.
                       "warmup": {"requests": 0, "failed": 0},
                       "cluster": cluster_json, "rates": []}
                if unloaded is not None and c == 0:
                    run["unloaded"] = unloaded
                for k, rate, specs, times in points:
                    results, summary = jobs[(c, k)].result()
                    records = [record(s, results[request_id(s.index)], at, rate)
                               for s, at in zip(specs, times)]
                    run["rates"].append({
                        "rate": rate,
                        "arrival": {"process": self.kind, "burstiness": args.burstiness,
                                    "scheduled_span_s": times[-1],
                                    "offered_rate": ((len(times) - 1) / times[-1]
                                                     if times[-1] > 0 else math.inf)},
                        "summary": metrics.summarize(records, duration_s(records)),
                        "prefix_hit": prefix_hit(records),
                        "simulator": summary,
                        "requests": records})
                run["distserve_goodput"] = metrics.distserve_goodput(
                    [p["rate"] for p in run["rates"]],
                    [p["summary"].get("slo_attainment") for p in run["rates"]],
                    args.attainment_target)
                runs.append(run)
        return runs

    def result(self, runs, started, argv):
        config = {k: v for k, v in vars(self.args).items()}
        return cli._jsonable({
            "tool": "tandem_sim", "format_version": 1, "simulated": True,
            "started_at": started, "command": list(argv), "seed": self.args.seed,
            "rates": self.rates, "arrival": self.kind, "config": config,
            "slo_scale_targets": self.slo_targets, "runs": runs})


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.label and args.ab:
        parser.error("--label names one configuration; --ab names its two by their flags")
    config, rates, kind = cli.check_workload(parser, args)
    try:
        configs = configurations(args)
        sim_path = simulator_path(args.bin)
    except SimError as error:
        parser.error(str(error))
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="tandem-sim-") as scratch:
        sim = Sim(args, config, rates, kind, sim_path, args.work_dir or pathlib.Path(scratch))
        try:
            runs = sim.run(configs)
        except SimError as error:
            raise SystemExit(f"tandem sim: {error}") from None
    cli.print_report(runs)
    cli.write_outputs(args, runs, lambda: sim.result(runs, started, argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
