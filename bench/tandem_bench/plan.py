"""`tandem plan` / `python -m tandem_bench.plan`: the cheapest cluster that meets an SLO.

The workload flags are `tandem sim`'s (and `tandem bench`'s): the same seeded requests and arrival
times become the trace. The workers' templates (profile, scheduler, KV pool) come from --profile
and the scheduler flags, or from --cluster FILE (its first prefill, decode and "both" pools). The
search itself is C++ (sim/planner.h, run as `tandem_sim --plan=plan.json`): shapes (aggregated,
disaggregated), pool sizes, placement policies and token budgets, smallest pools first; it prints
the cheapest configuration meeting the attainment target, the runner-up, each one's margin and
rate headroom. --plot-dir draws attainment versus rate for the best families' configurations.
The plan.json format is docs/sim.md's ("Planning").
"""
import argparse
import datetime
import json
import math
import pathlib
import subprocess
import sys
import tempfile

from . import argtypes, cli, plots, sim

DESCRIPTION = """\
Finds the cheapest Tandem cluster that meets SLOs on a workload, by simulating candidates
(tandem_sim --plan): prefill:decode ratios and pool sizes, placement policies and token budgets
(chunk sizes). Cost is the number of workers, or per-role costs from --cost-*."""

EPILOG = """\
examples:
  # which pools serve 8 req/s of 512-token prompts within TTFT 500 ms and TPOT 50 ms, 90% of them?
  tandem plan --profile p.json --rate 8 --duration 60 --input-len 512 --output-len 128 \\
      --ttft-slo-ms 500 --tpot-slo-ms 50 --policies slo,least_loaded --token-budgets 256,512
  # prefill workers at twice a decode worker's price, with the attainment-vs-rate plot
  tandem plan --cluster templates.json --rate 4 --num-requests 400 --tpot-slo-ms 40 \\
      --cost-prefill 2 --plot-dir out

docs/sim.md ("Planning") describes the search and the output."""

SHAPES = ("aggregated", "disaggregated")


def _list(kind, convert, check, what):
    def parse(text):
        out = []
        for item in text.split(","):
            item = item.strip()
            try:
                value = convert(item)
            except ValueError:
                raise argparse.ArgumentTypeError(f"'{item}' is not {what}") from None
            if not check(value):
                raise argparse.ArgumentTypeError(f"'{item}' is not {what}")
            out.append(value)
        return out
    parse.__name__ = kind
    return parse


_policies = _list("policies", str, lambda p: p in sim.POLICIES,
                  f"a policy ({', '.join(sim.POLICIES)})")
_budgets = _list("token budgets", int, lambda b: b >= 1, "an integer >= 1")
_shapes = _list("shapes", str, lambda s: s in SHAPES, "aggregated or disaggregated")
_scales = _list("rate multiples", float, lambda s: s > 0 and math.isfinite(s),
                "a finite number > 0")


def build_parser():
    p = argparse.ArgumentParser(prog="tandem plan", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=cli._Formatter)
    sim.add_cluster_args(p)
    g = p.add_argument_group("search")
    g.add_argument("--policies", type=_policies, default=["slo"], metavar="P1,P2",
                   help=f"placement policies to try ({', '.join(sim.POLICIES)})")
    g.add_argument("--token-budgets", "--token_budgets", type=_budgets, default=[],
                   metavar="N1,N2", help="tokens per engine step to try, the chunk size of chunked "
                                         "prefill (default: the profile's)")
    g.add_argument("--shapes", type=_shapes, default=list(SHAPES), metavar="S1,S2",
                   help="aggregated (workers doing both) and/or disaggregated (prefill + decode)")
    g.add_argument("--max-workers", "--max_workers", type=argtypes.positive(int), default=64,
                   metavar="N", help="the most workers of one configuration")
    for role in ("prefill", "decode", "both"):
        g.add_argument(f"--cost-{role}", f"--cost_{role}", type=sim._nonneg_float, default=1.0,
                       metavar="C", help=f"the cost of one {role} worker")
    g.add_argument("--max-rate-scale", type=argtypes.positive(float), default=8.0, metavar="X",
                   help="rate headroom is searched up to X times the workload's rate")
    g.add_argument("--curve-scales", type=_scales, default=[0.25, 0.5, 0.75, 1, 1.25, 1.5, 2],
                   metavar="X1,X2", help="rate multiples of the --plot-dir curves")
    g.add_argument("--curves", type=sim._nonneg_int, default=4, metavar="N",
                   help="configurations drawn in the plot (the best families')")
    g.add_argument("--plot", dest="plot_dir", type=pathlib.Path, default=None, metavar="DIR",
                   help="write attainment_vs_rate.png here: attainment versus rate per "
                        "configuration (the same as --plot-dir)")
    sim.add_simulator_args(g, jobs="simulations run at once (threads of tandem_sim)",
                           work_dir="keep cluster.json, trace.jsonl and plan.json here")
    cli.add_workload_args(p, live=False)
    return p


# Flags of `tandem sim` that name pool sizes or a single policy: the plan searches those.
_SEARCHED = {"prefill_workers": "--prefill-workers", "decode_workers": "--decode-workers",
             "aggregated": "--aggregated", "policy": "--policy (give --policies)",
             "fail": "--fail"}


def check(parser, args):
    """(templates cluster dict, trace lines, offered rate) from the flags; parser.error on bad
    ones."""
    for dest, flag in _SEARCHED.items():
        if getattr(args, dest) is not None:
            parser.error(f"{flag} is what tandem plan searches; leave it out")
    if args.rates:
        parser.error("--rates: a plan is for one workload; give --rate (the headroom and the plot "
                     "cover other rates)")
    if args.rate is None or math.isinf(args.rate):
        parser.error("--rate: give the workload's finite arrival rate (requests/s)")
    if args.label is not None:
        parser.error("--label names a run of tandem bench or tandem sim; tandem plan labels "
                     "each configuration it tries")
    if args.slo_scale is not None:
        parser.error("--slo-scale is not supported by tandem plan; give --ttft-slo-ms and/or "
                     "--tpot-slo-ms")
    if args.plot_dir is not None and not args.curve_scales:
        parser.error("--plot-dir needs --curve-scales")
    config, rates, kind = cli.check_workload(parser, args)
    if not (args.ttft_slo_ms or args.tpot_slo_ms or any(
            c.ttft_ms or c.tpot_ms for c in config.slo_classes)):
        parser.error("no objective: give --ttft-slo-ms and/or --tpot-slo-ms (or --slo-class "
                     "with targets)")
    try:
        if args.cluster is None:
            args.prefill_workers, args.decode_workers = 1, 1   # one template pool per role
        templates = sim.cluster_from_flags(args)
    except sim.SimError as error:
        parser.error(str(error))
    finally:
        args.prefill_workers = args.decode_workers = None
    specs, times = cli.sweep_point(args, config, kind, 0, rates[0], text=False)
    return templates, sim.trace_lines(specs, times)


def plan_options(args):
    """plan.json (docs/sim.md) for the flags."""
    return {"ttft_slo_ms": args.ttft_slo_ms or 0, "tpot_slo_ms": args.tpot_slo_ms or 0,
            "attainment_target": args.attainment_target,
            "costs": {"prefill": args.cost_prefill, "decode": args.cost_decode,
                      "both": args.cost_both},
            "policies": args.policies, "token_budgets": args.token_budgets,
            "shapes": args.shapes, "max_workers": args.max_workers,
            "max_rate_scale": args.max_rate_scale,
            "curve_scales": args.curve_scales if args.plot_dir is not None else [],
            "curves": args.curves, "jobs": args.jobs}


def run_planner(sim_path, directory, templates, trace, options, seed):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cluster.json").write_text(json.dumps(templates, indent=1) + "\n")
    (directory / "trace.jsonl").write_text("\n".join(trace) + "\n")
    (directory / "plan.json").write_text(json.dumps(options, indent=1) + "\n")
    result = subprocess.run(
        [str(sim_path), f"--cluster={directory / 'cluster.json'}",
         f"--trace={directory / 'trace.jsonl'}", f"--plan={directory / 'plan.json'}",
         f"--seed={seed}"], capture_output=True, text=True)
    if result.returncode != 0:
        raise sim.SimError(f"{sim.SIMULATOR} --plan failed (exit {result.returncode}): "
                           f"{result.stderr.strip() or result.stdout.strip()}")
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise sim.SimError(f"{sim.SIMULATOR} --plan printed no plan: {result.stdout!r}") from None


def _choice_line(name, c, target):
    if c is None:
        return f"{name:<10} none"
    headroom = (f">= {c['headroom_scale']:g}x" if c["headroom_capped"]
                else f"{c['headroom_scale']:.3g}x") + f" ({c['headroom_rate']:.3g} req/s)"
    return (f"{name:<10} {c['label']:<34} cost {c['cost']:g}  workers {c['workers']}  "
            f"attainment {100 * c['attainment']:.1f}% (margin {100 * c['margin']:+.1f} pts)  "
            f"rate headroom {headroom}")


def report(plan, options):
    target = plan["attainment_target"]
    objectives = " and ".join(f"{k.split('_')[0].upper()} <= {options[k]:g} ms"
                              for k in ("ttft_slo_ms", "tpot_slo_ms") if options[k])
    lines = [f"tandem plan: {plan['requests']} requests at {plan['offered_rate']:.3g} req/s; "
             f"target {100 * target:g}% of requests within "
             f"{objectives or 'their classes targets'} ({plan['simulations']} simulations"
             f"{', stopped early' if plan['truncated'] else ''})",
             _choice_line("best:", plan["best"], target),
             _choice_line("runner-up:", plan["runner_up"], target)]
    if plan["best"] is None:
        lines.append(f"nothing within --max-workers {options['max_workers']} meets the target; "
                     "the families' largest configurations tried are below")
    lines.append("families (each one's cheapest configuration meeting the target, else the "
                 "largest tried):")
    lines.append(f"  {'configuration':<34} {'cost':>6} {'attainment':>11}  meets")
    for f in plan["families"]:
        lines.append(f"  {f['label']:<34} {f['cost']:>6g} {100 * f['attainment']:>10.1f}%  "
                     f"{'yes' if f['meets'] else 'no'}")
    return "\n".join(lines)


def plot(plan, directory):
    """attainment_vs_rate.png through plots.py: one line per configuration curve."""
    runs = [{"label": c["label"],
             "rates": [{"rate": r, "summary": {"slo_attainment": a}}
                       for r, a in zip(c["rates"], c["attainments"])]}
            for c in plan["curves"]]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "attainment_vs_rate.png"
    plots.attainment_vs_rate(runs, path, plan["attainment_target"])
    return path


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    templates, trace = check(parser, args)
    try:
        sim_path = sim.simulator_path(args.bin)
    except sim.SimError as error:
        parser.error(str(error))
    options = plan_options(args)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="tandem-plan-") as scratch:
        try:
            plan = run_planner(sim_path, args.work_dir or pathlib.Path(scratch), templates, trace,
                               options, args.seed)
        except sim.SimError as error:
            raise SystemExit(f"tandem plan: {error}") from None
    print(report(plan, options))
    if args.result_json:
        cli.write_result_json(args.result_json, cli._jsonable({
            "tool": "tandem_plan", "format_version": 1, "started_at": started,
            "command": argv, "seed": args.seed, "plan_options": options,
            "templates": templates, "plan": plan}))
    if args.plot_dir:
        print(f"plot: {plot(plan, args.plot_dir)}")
    return 0 if plan["best"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
