"""`tandem bench` / `python -m tandem_bench`: flags, and the whole run.

A run: for each configuration (the server at --url, one cluster started with --up, or the two
clusters of --ab), warm up, measure the unloaded latencies if an SLO scale asks for them, then for
each rate of the sweep send the seeded workload open loop and summarize it; at the end print the
tables, write the result JSON and the plots.
"""
import argparse
import asyncio
import dataclasses
import datetime
import json
import math
import os
import pathlib
import sys

from . import argtypes, arrivals, clients, cluster, metrics, plots, report, runner, workload

DEFAULT_URLS = {"openai": "http://127.0.0.1:8000", "grpc": "127.0.0.1:7000"}

DESCRIPTION = """\
Open-loop load generator for Tandem: sends a seeded workload at a Poisson, Gamma (bursty) or
constant rate (or a sweep of rates) over the OpenAI HTTP API or Tandem's gRPC API, and reports
TTFT, TPOT, inter-token and end-to-end latency, throughput, SLO attainment and goodput.
It can start the cluster itself (`tandem up`, --up) and compare two configurations (--ab)."""

EPILOG = """\
examples:
  # a running cluster (tandem up), Poisson arrivals at 2 req/s
  tandem bench --rate 2 --num-requests 100 --input-len 256 --output-len 64
  # a sweep with SLOs, result JSON and plots; DistServe goodput from the sweep
  tandem bench --rates 1,2,4,8 --duration 60 --ttft-slo-ms 500 --tpot-slo-ms 100 \\
      --result-json out/result.json --plot-dir out
  # start the cluster and compare two placement policies on a shared-prefix workload
  tandem bench --up "aggregated decode_workers=2" --ab policy=round_robin policy=kv_aware \\
      --shared-prefix 4,8,512 --input-len 32 --output-len 16 --rates 1,2

docs/bench.md defines every figure."""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's lines; adds "(default: X)" where a flag has a real default."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (default is not None and default is not False and default != []
                and default is not argparse.SUPPRESS and "default" not in text
                and action.option_strings and action.nargs != 0):
            text += " (default: %(default)s)"
        return text


def _rate(text):
    if text.strip().lower() in ("inf", "infinity"):
        return math.inf
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a rate (a number or inf)") from None
    if not value > 0 or math.isnan(value):
        raise argparse.ArgumentTypeError(f"a rate must be positive, not {text}")
    return value


def _rates(text):
    rates = [_rate(part) for part in text.split(",") if part.strip()]
    if not rates:
        raise argparse.ArgumentTypeError("--rates needs at least one rate")
    if len(set(rates)) != len(rates):
        raise argparse.ArgumentTypeError(f"--rates '{text}' repeats a rate")
    return sorted(rates)


def build_parser():
    p = argparse.ArgumentParser(prog="tandem bench", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=_Formatter)
    g = p.add_argument_group("target")
    g.add_argument("--protocol", choices=("openai", "grpc"), default="openai",
                   help="OpenAI HTTP API (SSE streaming) or tandem.v1.Inference/Generate")
    g.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="a prompt (/v1/completions; gRPC prompt) or messages (/v1/chat/completions;"
                        " gRPC chat)")
    g.add_argument("--url", help="the server: http://host:port for openai, host:port for grpc "
                                 f"(default {DEFAULT_URLS['openai']} / {DEFAULT_URLS['grpc']}, "
                                 "`tandem up`'s ports); not with --up / --ab")
    g.add_argument("--tls-ca", metavar="FILE",
                   help="PEM CA that verifies a server at --url over TLS: https:// for openai, "
                        "TLS gRPC (`tandem up --tls` prints its CA); --up / --ab with `tls` in "
                        "their flags use their cluster's")
    g.add_argument("--api-key", metavar="KEY",
                   help="API key sent to the server (Authorization: Bearer; gRPC `authorization` "
                        "metadata); without it $TANDEM_API_KEY, then $OPENAI_API_KEY. Never "
                        "printed or written to the result JSON; prefer the environment, since "
                        "other users of the machine can read a command line")
    g.add_argument("--model", help="model id sent with every request (default: the server's only "
                                   "model)")
    g.add_argument("--request-timeout", type=argtypes.positive(float), default=300.0, metavar="S",
                   help="a request that takes longer fails")
    g.add_argument("--worker-metrics", action="append", default=[], metavar="URL",
                   help="a worker's Prometheus /metrics URL, for the prefix-hit rate of a server "
                        "at --url (repeatable; an https:// one is checked against --tls-ca); "
                        "--up / --ab find their workers' themselves")

    g = p.add_argument_group("cluster (started with `tandem up`, stopped with SIGTERM)")
    g.add_argument("--up", nargs="?", const="", metavar="FLAGS",
                   help="start a cluster with these `tandem up` flags, e.g. \"aggregated "
                        "decode_workers=2\" (no value: the default 1 prefill + 1 decode)")
    g.add_argument("--ab", nargs=2, metavar=("A", "B"),
                   help="compare two clusters, each `tandem up` with --up's flags plus its own, "
                        "e.g. --ab policy=round_robin policy=kv_aware, or --ab aggregated \"\"")
    g.add_argument("--bin", type=pathlib.Path, default=None, metavar="DIR",
                   help="where tandem, tandem-router, tandem-prefill and tandem-decode are "
                        "(default: $TANDEM_BIN_DIR, else <repo>/build/release/bin)")
    g.add_argument("--up-timeout", type=argtypes.positive(float), default=180.0, metavar="S",
                   help="how long a cluster may take to become healthy")
    g.add_argument("--cluster-log", type=pathlib.Path, metavar="FILE",
                   help="append the clusters' output to this file")

    add_workload_args(p, live=True)
    return p


def add_workload_args(p, live):
    """The load, workload, SLO and output flags, shared with `tandem sim` (tandem_bench.sim).
    `live` adds the flags that only mean something against a real server (concurrency cap,
    warm-up, sampling, EOS, sending the targets)."""
    g = p.add_argument_group("load")
    rate = g.add_mutually_exclusive_group()
    rate.add_argument("--rate", type=_rate, default=None,
                      help="requests/s (inf: all at once) [default: inf]")
    rate.add_argument("--rates", type=_rates, metavar="R1,R2,...",
                      help="a sweep over these rates, each a separate run")
    g.add_argument("--arrival", choices=arrivals.KINDS, default=None,
                   help="arrival process [default: poisson, or gamma when --burstiness != 1]")
    g.add_argument("--burstiness", type=argtypes.positive(float), default=1.0,
                   help="Gamma shape: the gaps' coefficient of variation is 1/sqrt(burstiness); "
                        "1 = Poisson, < 1 burstier")
    size = g.add_mutually_exclusive_group()
    size.add_argument("--num-requests", type=argtypes.positive(int), default=None, metavar="N",
                      help="requests per rate [default: 100]")
    size.add_argument("--duration", type=argtypes.positive(float), default=None, metavar="S",
                      help="send for this many seconds per rate (then wait for the answers)")
    if live:
        g.add_argument("--max-concurrency", type=argtypes.positive(int), default=None, metavar="N",
                       help="at most N requests in flight; later arrivals wait here")
    g.add_argument("--seed", type=int, default=0,
                   help="seed of prompts, lengths, mixes and arrivals: the same seed, the same run")
    if live:
        g.add_argument("--warmup", type=int, default=1, metavar="N",
                       help="requests sent one by one before measuring (not in the figures; if "
                            "all of them fail the run stops)")

    g = p.add_argument_group("workload")
    g.add_argument("--input-len", type=argtypes.positive(int), default=128, metavar="TOKENS",
                   help="prompt tokens of synthetic prompts (the question, with --shared-prefix)")
    g.add_argument("--output-len", type=argtypes.positive(int), default=None, metavar="TOKENS",
                   help="output tokens (max_tokens) [default: 64; with --dataset: the dataset's]")
    g.add_argument("--range-ratio", type=float, default=0.0, metavar="R",
                   help="lengths uniform in [L(1-R), L(1+R)]; 0: fixed")
    g.add_argument("--dataset", type=pathlib.Path, metavar="FILE",
                   help="JSONL (or JSON array) of ShareGPT conversations or {\"prompt\", "
                        "\"output_tokens\"} objects")
    g.add_argument("--shared-prefix", metavar="N,M,LEN",
                   help="N system prompts of LEN tokens, each shared by M prompts (for "
                        "cache-aware routing)")
    g.add_argument("--tenant", action="append", default=[], metavar="SPEC",
                   help="a share of the traffic: \"name=a,weight=0.8[,model=M][,priority=P]\" "
                        "(repeatable)")
    g.add_argument("--slo-class", action="append", default=[], metavar="SPEC",
                   help="\"name=chat,weight=0.8,ttft_ms=300,tpot_ms=50[,priority=1]\" "
                        "(repeatable); a class's targets and priority beat the defaults")
    g.add_argument("--priority", type=int, default=0, help="priority of every request")
    if live:
        g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature")
        g.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                       help="let the model stop at EOS (output lengths then vary; reported as "
                            "sent)")

    g = p.add_argument_group("SLOs and goodput")
    g.add_argument("--ttft-slo-ms", type=argtypes.positive(float), metavar="MS",
                   help="TTFT target of requests whose class sets none")
    g.add_argument("--tpot-slo-ms", type=argtypes.positive(float), metavar="MS",
                   help="TPOT target of requests whose class sets none")
    g.add_argument("--slo-scale", type=argtypes.positive(float), metavar="X",
                   help="targets = X times the unloaded TTFT and TPOT (medians of "
                        "--unloaded-requests sequential requests, on the first configuration)")
    g.add_argument("--unloaded-requests", type=argtypes.positive(int), default=3, metavar="N",
                   help="sequential requests that measure the unloaded latencies")
    g.add_argument("--attainment-target", type=argtypes.ratio, default=0.9, metavar="F",
                   help="DistServe goodput: the highest rate whose attainment stays >= F")
    if live:
        g.add_argument("--no-send-slo", dest="send_slo", action="store_false",
                       help="do not send the targets with the requests (GenerateRequest.slo over "
                            "gRPC, Tandem's \"slo\" field over HTTP); they are still measured")

    g = p.add_argument_group("output")
    g.add_argument("--result-json", type=pathlib.Path, metavar="FILE",
                   help="write every request's timings, the config, seed, rates and summaries")
    g.add_argument("--plot-dir", type=pathlib.Path, metavar="DIR",
                   help="write latency_cdf.png, latency_vs_rate.png, attainment_vs_rate.png")
    g.add_argument("--label", help="name of this configuration in tables and plots")
    g.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar")


def api_key(flag, environ):
    """The key to send: --api-key, else $TANDEM_API_KEY, else $OPENAI_API_KEY; None for none."""
    for value in (flag, environ.get("TANDEM_API_KEY"), environ.get("OPENAI_API_KEY")):
        if value:
            return value
    return None


def redact_api_key(argv):
    """argv with the value of --api-key (either spelling, or an unambiguous prefix such as
    --ap, which argparse accepts too) replaced by "<redacted>"."""
    out, hide_next = [], False
    for arg in argv:
        name, eq, _ = arg.partition("=")
        if hide_next:
            out.append("<redacted>")
            hide_next = False
        elif name.startswith("--ap") and "--api-key".startswith(name):
            out.append(f"{name}=<redacted>" if eq else arg)
            hide_next = not eq
        else:
            out.append(arg)
    return out


def _printable_token(text):
    return all(" " < c <= "~" for c in text)


def _check(parser, args):
    """Turns the flags into (workload config, rates, arrival kind); parser.error on bad ones."""
    if args.url and (args.up is not None or args.ab):
        parser.error("--url names a running server; --up / --ab start their own")
    if args.worker_metrics and (args.up is not None or args.ab):
        parser.error("--worker-metrics is for a server at --url; --up / --ab find their workers")
    if args.label and args.ab:
        parser.error("--label names one configuration; --ab names its two by their flags")
    if args.bin is not None and args.up is None and not args.ab:
        parser.error("--bin is only used with --up or --ab")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    try:
        for flags in ([args.up or ""] + list(args.ab or [])):
            cluster.parse_up_flags(flags)
    except ValueError as error:
        parser.error(str(error))
    args.api_key = api_key(args.api_key, os.environ)
    if args.api_key is not None and not _printable_token(args.api_key):
        # The key's text stays out of the message.
        parser.error("the API key (--api-key, TANDEM_API_KEY or OPENAI_API_KEY) has a space, a "
                     "control or a non-ASCII character; an API key is printable ASCII without "
                     "spaces")
    return check_workload(parser, args)


def check_workload(parser, args):
    """The flags of add_workload_args as (workload config, rates, arrival kind); parser.error on
    bad ones."""
    kind = args.arrival or ("gamma" if args.burstiness != 1.0 else "poisson")
    if kind != "gamma" and args.burstiness != 1.0:
        parser.error(f"--burstiness {args.burstiness:g} needs --arrival gamma (not {kind})")
    rates = args.rates or [args.rate if args.rate is not None else math.inf]
    if args.duration is not None and any(math.isinf(r) for r in rates):
        parser.error("--duration needs finite rates (an infinite rate sends everything at once; "
                     "use --num-requests)")
    if args.slo_scale is not None and (args.ttft_slo_ms is not None or args.tpot_slo_ms is not None):
        parser.error("give either --slo-scale or --ttft-slo-ms / --tpot-slo-ms, not both")
    if args.dataset is not None and args.shared_prefix:
        parser.error("--dataset and --shared-prefix cannot be combined")
    try:
        tenants = tuple(workload.parse_tenant(t) for t in args.tenant)
        classes = tuple(workload.parse_slo_class(c) for c in args.slo_class)
        config = workload.WorkloadConfig(
            input_lengths=workload.Lengths(args.input_len, args.range_ratio),
            output_lengths=workload.Lengths(args.output_len or 64, args.range_ratio),
            dataset=workload.load_dataset(args.dataset) if args.dataset is not None else None,
            output_len_override=args.output_len is not None,
            shared_prefix=(workload.parse_shared_prefix(args.shared_prefix)
                           if args.shared_prefix else None),
            tenants=tenants, slo_classes=classes, model=getattr(args, "model", None),
            priority=args.priority,
            ttft_slo_ms=args.ttft_slo_ms, tpot_slo_ms=args.tpot_slo_ms)
    except (workload.WorkloadError, ValueError) as error:
        parser.error(str(error))
    return config, rates, kind


def _jsonable(value):
    """The value with infinities as the string "inf" and NaNs as null (strict JSON)."""
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return None if math.isnan(value) else value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, pathlib.Path):
        return str(value)
    return value


def _median(values):
    return metrics.percentile(values, 50) if values else None


class Bench:
    """One invocation: the checked flags and what the configurations share (the SLO targets)."""

    def __init__(self, args, config, rates, kind):
        self.args = args
        self.config = config
        self.rates = rates
        self.kind = kind
        self.options = clients.ClientOptions(
            endpoint=args.endpoint, temperature=args.temperature, ignore_eos=args.ignore_eos,
            send_slo=args.send_slo, request_timeout_s=args.request_timeout,
            ca_file=args.tls_ca, api_key=args.api_key)
        self.slo_targets = None   # {"ttft_ms", "tpot_ms"} from --slo-scale, set by the first run

    def _progress(self, total, desc):
        if not self.args.progress:
            return None
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, leave=True,
                    dynamic_ncols=True)

    async def run_config(self, label, url, worker_metrics, up_flags=None, options=None):
        args = self.args
        client = clients.make_client(args.protocol, url, options or self.options)
        run = {"label": label, "target": url, "protocol": args.protocol, "endpoint": args.endpoint,
               "up_flags": up_flags, "worker_metrics": dict(worker_metrics), "rates": []}
        try:
            try:
                await client.connect()
            except ConnectionError as error:
                raise SystemExit(f"tandem bench: {error}") from None
            if args.warmup:
                warm = await runner.run_sequential(
                    client, workload.build(self.config, args.seed, args.warmup, stream="warmup"),
                    tag="warmup")
                run["warmup"] = {"requests": len(warm), "failed": sum(not r["ok"] for r in warm)}
                if all(not r["ok"] for r in warm):
                    raise SystemExit(f"tandem bench: every warm-up request to {url} failed; the "
                                     f"first error: {warm[0]['error']}")
            if args.slo_scale is not None:
                unloaded = await runner.run_sequential(
                    client, workload.build(self.config, args.seed, args.unloaded_requests,
                                           stream="unloaded"), tag="unloaded")
                ok = [r for r in unloaded if r["ok"]]
                figures = {"requests": len(unloaded), "failed": len(unloaded) - len(ok),
                           "ttft_ms": _median([r["ttft_ms"] for r in ok]),
                           "tpot_ms": _median([r["tpot_ms"] for r in ok if r["tpot_ms"] is not None])}
                run["unloaded"] = figures
                if self.slo_targets is None:
                    if figures["ttft_ms"] is None:
                        raise SystemExit("tandem bench: no unloaded request succeeded, so "
                                         "--slo-scale has nothing to scale; first error: "
                                         f"{unloaded[0]['error']}")
                    self.slo_targets = {
                        "scale": args.slo_scale, "measured_on": label,
                        "ttft_ms": args.slo_scale * figures["ttft_ms"],
                        "tpot_ms": (args.slo_scale * figures["tpot_ms"]
                                    if figures["tpot_ms"] is not None else None)}
                    print(f"unloaded latency on {label}: TTFT {figures['ttft_ms']:.1f} ms, TPOT "
                          f"{report.fmt(figures['tpot_ms'])} ms; SLO x{args.slo_scale:g}: TTFT "
                          f"{self.slo_targets['ttft_ms']:.1f} ms, TPOT "
                          f"{report.fmt(self.slo_targets['tpot_ms'])} ms", file=sys.stderr)
            probe = (cluster.PrefixHitProbe(worker_metrics,
                                            ca_file=(options or self.options).ca_file)
                     if worker_metrics else None)
            for k, rate in enumerate(self.rates):
                specs, times = sweep_point(args, self.config, self.kind, k, rate)
                if self.slo_targets is not None:
                    specs = workload.with_slo_defaults(specs, self.slo_targets["ttft_ms"],
                                                       self.slo_targets["tpot_ms"])
                bar = self._progress(len(specs), f"{label} @ {report.rate_text(rate)} req/s")
                if probe:
                    probe.start()
                records, duration = await runner.run_rate(
                    client, specs, times, rate, max_concurrency=args.max_concurrency,
                    progress=bar, tag=f"r{k}")
                if bar is not None:
                    bar.close()
                point = {"rate": rate,
                         "arrival": {"process": self.kind, "burstiness": args.burstiness,
                                     "scheduled_span_s": times[-1],
                                     "offered_rate": ((len(times) - 1) / times[-1]
                                                      if times[-1] > 0 else math.inf)},
                         "summary": metrics.summarize(records, duration),
                         "prefix_hit": probe.stop() if probe else None,
                         "requests": records}
                run["rates"].append(point)
        finally:
            await client.close()
        attainments = [p["summary"].get("slo_attainment") for p in run["rates"]]
        run["distserve_goodput"] = metrics.distserve_goodput(
            [p["rate"] for p in run["rates"]], attainments, args.attainment_target)
        return run

    def configurations(self):
        """(label, `tandem up` flags or None) of each configuration to run."""
        args = self.args
        if args.ab:
            base = cluster.parse_up_flags(args.up or "")
            return [(text.strip() or "default", base + cluster.parse_up_flags(text))
                    for text in args.ab]
        if args.up is not None:
            return [(args.label or ("up " + args.up if args.up else "up"),
                     cluster.parse_up_flags(args.up))]
        return [(args.label or args.url or DEFAULT_URLS[args.protocol], None)]

    def run(self):
        args = self.args
        runs = []
        for label, flags in self.configurations():
            if flags is None:
                url = args.url or DEFAULT_URLS[args.protocol]
                metrics_urls = {f"worker{i}": u for i, u in enumerate(args.worker_metrics)}
                runs.append(asyncio.run(self.run_config(label, url, metrics_urls)))
                continue
            bin_dir = args.bin or cluster.default_bin_dir()
            print(f"starting `tandem up {' '.join(flags)}` from {bin_dir}", file=sys.stderr)
            try:
                with cluster.LocalCluster(bin_dir, flags, timeout_s=args.up_timeout,
                                          log_path=args.cluster_log) as c:
                    url = c.http_url if args.protocol == "openai" else c.grpc_target
                    # A cluster of `tandem up --tls`: its own CA verifies it.
                    options = dataclasses.replace(self.options, ca_file=c.ca_file) \
                        if c.ca_file else self.options
                    runs.append(asyncio.run(self.run_config(label, url, c.worker_metrics, flags,
                                                            options)))
            except cluster.ClusterError as error:
                raise SystemExit(f"tandem bench: {error}") from None
        return runs

    def result(self, runs, started, argv):
        args = self.args
        # Every flag but the key (whose presence is recorded, not its text).
        config = {k: v for k, v in vars(args).items() if k != "api_key"}
        config["api_key_sent"] = args.api_key is not None
        return _jsonable({
            "tool": "tandem_bench", "format_version": 1,
            "started_at": started, "command": redact_api_key(argv), "seed": args.seed,
            "rates": self.rates, "arrival": self.kind, "config": config,
            "slo_scale_targets": self.slo_targets, "runs": runs})


def print_report(runs):
    """The table (side by side for two runs) and each rate's commonest errors."""
    if len(runs) == 2:
        print(report.ab_table(runs[0], runs[1]))
    else:
        print(report.run_table(runs[0]))
    for run in runs:
        for point in run["rates"]:
            errors = point["summary"]["errors"]
            if errors:
                top = "; ".join(f"{n} x {message}" for message, n in list(errors.items())[:3])
                print(f"{run['label']} @ {report.rate_text(point['rate'])} req/s: failed requests: "
                      f"{top}")


def sweep_point(args, config, kind, k, rate, text=True):
    """(specs, arrival times) of the k-th rate of the sweep: the seeded requests `tandem bench`
    sends at `rate`, and `tandem sim` and `tandem plan` simulate (with text=False)."""
    process = arrivals.ArrivalProcess(kind, rate, args.burstiness)
    times = arrivals.schedule(process, arrivals.rng_for(args.seed, "arrivals", k),
                              num_requests=None if args.duration else args.num_requests or 100,
                              duration_s=args.duration)
    return workload.build(config, args.seed, len(times), stream=f"rate{k}", text=text), times


def write_result_json(path, result):
    """`result` (a dict) as the result JSON at `path`, and where it went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    print(f"results: {path}")


def write_outputs(args, runs, result):
    """What --result-json (the dict `result()` makes) and --plot-dir ask for, for `runs`."""
    if args.result_json:
        write_result_json(args.result_json, result())
    if args.plot_dir:
        for path in plots.write_all(runs, args.plot_dir, args.attainment_target):
            print(f"plot: {path}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    config, rates, kind = _check(parser, args)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    bench = Bench(args, config, rates, kind)
    runs = bench.run()
    print()
    print_report(runs)
    write_outputs(args, runs, lambda: bench.result(runs, started, argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
