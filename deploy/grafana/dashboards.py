#!/usr/bin/env python3
"""The Grafana dashboards of a Tandem cluster, written as JSON into deploy/grafana/dashboards/.

The JSON files are what Grafana provisions (provisioning/dashboards/tandem.yml); this file is
where they are defined, so that the five dashboards share their variables, units and layout:

    python3 deploy/grafana/dashboards.py            # rewrite dashboards/*.json
    python3 deploy/grafana/dashboards.py --check    # exit 1 if a JSON file is out of date

Every dashboard has the variables datasource, namespace, pool and worker. They select on the
labels the scrape configs attach (deploy/prometheus): namespace (one cluster at a time), pool
(router, prefill, decode) and pod; `worker` lists the pods of the chosen pools. The router labels its per-worker
gauges of the slo policy (corrections, step speed) with the worker's id: the pod name in
`tandem up` and in deploy/k8s (TANDEM_WORKER_ID), "<pod>:<port>" when a worker names itself (its
default), hence the "($worker)(:[0-9]+)?" selectors. The router's health gauge is labelled with worker addresses
and is shown for every worker.
"""
import argparse
import json
import pathlib
import sys

OUT_DIR = pathlib.Path(__file__).resolve().parent / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# Selectors of the router's figures (recorded by namespace), and of a worker pool's targets.
NS = 'namespace=~"$namespace"'
WORKERS = 'namespace=~"$namespace", pool=~"$pool", pod=~"$worker"'
ROUTER_WORKER = 'namespace=~"$namespace", worker=~"($worker)(:[0-9]+)?"'


def target(expr, legend=""):
    return {"expr": expr, "legendFormat": legend}


def panel(title, description, targets, unit="short", kind="timeseries", stack=False,
          thresholds=None, width=12, height=8):
    """A panel without position and id (layout() gives them). `targets` is a list of target()."""
    defaults = {"unit": unit}
    if thresholds is not None:
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
    if kind == "timeseries":
        defaults["custom"] = {"lineWidth": 1, "fillOpacity": 20 if stack else 0,
                              "stacking": {"mode": "normal" if stack else "none"},
                              "showPoints": "never"}
        options = {"legend": {"displayMode": "list", "placement": "bottom"},
                   "tooltip": {"mode": "multi"}}
    else:
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "colorMode": "value", "graphMode": "area", "textMode": "auto"}
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [dict(t, refId=chr(ord("A") + i), datasource=DATASOURCE)
                    for i, t in enumerate(targets)],
        "gridPos": {"w": width, "h": height},
    }


def layout(panels):
    """Ids 1..n and positions: left to right, then down, on Grafana's 24-column grid."""
    x = y = row_height = 0
    for i, p in enumerate(panels, start=1):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > 24:
            x, y = 0, y + row_height
            row_height = 0
        p["id"] = i
        p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        x += w
        row_height = max(row_height, h)
    return panels


def query_variable(name, label, query, include_all=True, regex="", multi=True):
    return {
        "type": "query", "name": name, "label": label, "datasource": DATASOURCE,
        "definition": query, "query": {"query": query, "refId": f"{name}-values"},
        "refresh": 2, "sort": 1, "regex": regex, "multi": multi, "includeAll": include_all,
        "allValue": ".*" if include_all else None,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]} if include_all else {},
        "options": [], "hide": 0,
    }


def variables(pool_regex=""):
    """datasource, namespace, pool and worker. A pool dashboard (pool_regex set) offers only the
    pools whose names match, without "All"."""
    pool_query = 'label_values(up{namespace=~"$namespace", pool!=""}, pool)'
    if pool_regex:
        pool = query_variable("pool", "Pool", pool_query, include_all=False, regex=pool_regex,
                              multi=False)
    else:
        pool = query_variable("pool", "Pool", pool_query)
    return [
        {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
         "current": {}, "hide": 0, "options": [], "refresh": 1, "regex": ""},
        query_variable("namespace", "Namespace", 'label_values(up{pool!=""}, namespace)',
                       include_all=False, multi=False),
        pool,
        query_variable("worker", "Worker",
                       'label_values(tandem_worker_kv_usage_ratio{namespace=~"$namespace", '
                       'pool=~"$pool"}, pod)'),
    ]


def dashboard(uid, title, description, panels, pool_regex=""):
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["tandem"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "version": 1,
        "links": [{"type": "dashboards", "tags": ["tandem"], "asDropdown": True,
                   "title": "Tandem", "includeVars": True, "keepTime": True}],
        "templating": {"list": variables(pool_regex)},
        "annotations": {"list": []},
        "panels": layout(panels),
    }


def quantiles(metric, selector, qs, legend_prefix=""):
    return [target(f'histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{selector}}}'
                   f'[$__rate_interval])))', f"{legend_prefix}p{round(q * 100)}") for q in qs]


def overview():
    return dashboard("tandem-overview", "Tandem / Cluster overview",
                     "Requests, latencies, SLO attainment, KV cache and transfers of a cluster", [
        panel("Requests", "Requests finished per second by outcome (router)",
              [target(f"sum by (outcome) (namespace:tandem_router_requests:rate1m{{{NS}}})",
                      "{{outcome}}")], unit="reqps", stack=True),
        panel("Goodput", "Requests per second that met their TTFT and TPOT objectives, of all "
              "finished requests with objectives",
              [target(f"sum(namespace:tandem_router_goodput:rate1m{{{NS}}})", "goodput"),
               target(f"sum(namespace:tandem_router_slo_requests:rate1m{{{NS}}})",
                      "with objectives")], unit="reqps"),
        panel("SLO attainment", "Share of requests with objectives that met both, and the "
              "objective (tandem:slo_attainment:objective)",
              [target(f"namespace:tandem_router_slo_attainment:ratio_rate1m{{{NS}}}",
                      "attainment"),
               target("tandem:slo_attainment:objective", "objective")], unit="percentunit"),
        panel("Time to first token", "Arrival at the router to the first token relayed",
              [target(f"namespace:tandem_router_ttft_seconds:quantile1m{{{NS}}}",
                      "p{{quantile}}")], unit="s"),
        panel("Time per output token", "Gaps between consecutive tokens of the streams",
              [target(f"namespace:tandem_router_tpot_seconds:quantile1m{{{NS}}}",
                      "p{{quantile}}")], unit="s"),
        panel("End-to-end latency", "Arrival to the last token, successful requests",
              [target(f"namespace:tandem_router_e2e_seconds:quantile1m{{{NS}}}",
                      "p{{quantile}}")], unit="s"),
        panel("KV prefix hit rate", "Share of prompt tokens found in a prefix cache: the "
              "cluster's (no worker computed them) and each pool's",
              [target(f"namespace:tandem_kv_prefix_hit:ratio_rate1m{{{NS}}}", "cluster"),
               target(f'namespace_pool:tandem_worker_prefix_hit:ratio_rate1m{{{NS}, '
                      f'pool=~"$pool"}}', "{{pool}}")], unit="percentunit"),
        panel("KV cache usage", "The fullest worker's KV blocks in running sequences, by pool",
              [target(f'namespace_pool:tandem_worker_kv_usage_ratio:max{{{NS}, pool=~"$pool"}}',
                      "{{pool}}")], unit="percentunit"),
        panel("KV transfer bandwidth", "Bytes prefill workers wrote into decode workers' KV "
              "pools per second",
              [target(f"sum(namespace:tandem_prefill_transfer_bytes:rate1m{{{NS}}})",
                      "prefill -> decode")], unit="Bps"),
        panel("Sequences", "Sequences in the batch and waiting, by pool",
              [target(f'namespace_pool:tandem_worker_running_sequences:sum{{{NS}, '
                      f'pool=~"$pool"}}', "{{pool}} running"),
               target(f'namespace_pool:tandem_worker_waiting_sequences:sum{{{NS}, '
                      f'pool=~"$pool"}}', "{{pool}} waiting")]),
        panel("Targets up", "Processes answering scrapes, by pool",
              [target(f'sum by (pool) (up{{{NS}, pool=~"$pool"}})', "{{pool}}")],
              kind="stat", width=12, height=5),
        panel("Workers healthy", "Workers the routers take requests to (1 each), of those they "
              "know",
              [target(f"sum(max by (worker) (tandem_router_worker_healthy{{{NS}}}))", "healthy"),
               target(f"count(max by (worker) (tandem_router_worker_healthy{{{NS}}}))", "known")],
              kind="stat", width=12, height=5),
    ])


def pool_dashboard(pool):
    """The panels of a worker pool; the prefill pool adds its remote prefills and transfers."""
    panels = [
        panel("Prompt tokens", "Prompt tokens received per second, by worker",
              [target(f"sum by (pod) (rate(tandem_worker_prompt_tokens_total{{{WORKERS}}}"
                      "[$__rate_interval]))", "{{pod}}")]),
        panel("Prefix hit rate", "Share of each worker's prompt tokens found in its prefix cache",
              [target(f"sum by (pod) (rate(tandem_worker_prefix_hit_tokens_total{{{WORKERS}}}"
                      "[$__rate_interval])) / sum by (pod) (rate(tandem_worker_prompt_tokens_total"
                      f"{{{WORKERS}}}[$__rate_interval]))", "{{pod}}")], unit="percentunit"),
        panel("Computed tokens", "Tokens computed by engine steps per second (prompt and output)",
              [target(f"sum by (pod) (rate(tandem_worker_step_tokens_total{{{WORKERS}}}"
                      "[$__rate_interval]))", "{{pod}}")]),
        panel("Sequences", "Sequences in the batch (remote prefills included) and waiting",
              [target(f"sum by (pod) (tandem_worker_running_sequences{{{WORKERS}}})",
                      "{{pod}} running"),
               target(f"sum by (pod) (tandem_worker_waiting_sequences{{{WORKERS}}})",
                      "{{pod}} waiting")]),
        panel("KV blocks", "KV blocks of the chosen workers by state: used by sequences, cached "
              "(reusable prefixes), free",
              [target(f"sum by (state) (tandem_worker_kv_blocks{{{WORKERS}}})", "{{state}}")],
              stack=True),
        panel("KV cache usage", "Used / total KV blocks, by worker",
              [target(f"max by (pod) (tandem_worker_kv_usage_ratio{{{WORKERS}}})", "{{pod}}")],
              unit="percentunit", thresholds=[{"color": "green", "value": None},
                                              {"color": "red", "value": 0.9}]),
        panel("Engine step time", "Wall time per engine step",
              quantiles("tandem_worker_step_seconds", WORKERS, (0.5, 0.99)), unit="s"),
        panel("Batch size", "Mean sequences per engine step, by worker",
              [target(f"sum by (pod) (rate(tandem_worker_batch_size_sum{{{WORKERS}}}"
                      "[$__rate_interval])) / sum by (pod) (rate(tandem_worker_batch_size_count"
                      f"{{{WORKERS}}}[$__rate_interval]))", "{{pod}}")]),
        panel("Preemptions", "Sequences preempted for lack of KV blocks per second",
              [target(f"sum by (pod) (rate(tandem_worker_preemptions_total{{{WORKERS}}}"
                      "[$__rate_interval]))", "{{pod}}")]),
        panel("Step speed (router's view)", "Observed over predicted duration of each worker's "
              "latest engine steps, as the router's slo step model sees it; 1 is as fitted",
              [target(f"max by (worker) (tandem_router_step_speed_ratio{{{ROUTER_WORKER}}})",
                      "{{worker}}")]),
    ]
    if pool == "prefill":
        panels += [
            panel("Remote prefills", "Prefill requests per second by outcome",
                  [target(f"sum by (outcome) (rate(tandem_prefill_requests_total{{{WORKERS}}}"
                          "[$__rate_interval]))", "{{outcome}}")], unit="reqps"),
            panel("KV written", "KV bytes each prefill worker wrote into decode workers' pools "
                  "per second",
                  [target(f"sum by (pod) (rate(tandem_prefill_transfer_bytes_total{{{WORKERS}}}"
                          "[$__rate_interval]))", "{{pod}}")], unit="Bps"),
            panel("Prefill to KV in place", "Arrival at the prefill worker to its last KV write "
                  "in place (compute and transfer overlap)",
                  quantiles("tandem_prefill_transfer_seconds", WORKERS, (0.5, 0.99)), unit="s"),
        ]
    title = {"prefill": "Prefill pool", "decode": "Decode pool"}[pool]
    return dashboard(f"tandem-{pool}", f"Tandem / {title}",
                     f"The {pool} workers: load, prefix cache, KV blocks, engine steps",
                     panels, pool_regex=f"/{pool}/")


def router_dashboard():
    return dashboard("tandem-router", "Tandem / Router and placement",
                     "Placement and admission decisions, and how well the slo policy's "
                     "predictions match what happened", [
        panel("Placements", "Placement decisions per second by prefill location and reason",
              [target(f"sum by (prefill, reason) (namespace:tandem_router_placements:rate1m"
                      f"{{{NS}}})", "{{prefill}} ({{reason}})")], stack=True),
        panel("Admission", "Admission verdicts per second at arrival",
              [target(f"sum by (outcome) (namespace:tandem_router_admissions:rate1m{{{NS}}})",
                      "{{outcome}}")], unit="reqps", stack=True),
        panel("Rejections", "Requests refused by admission per second, by reason (0: none "
              "refused)",
              [target(f"sum by (reason) (rate(tandem_router_rejections_total{{{NS}}}"
                      f"[$__rate_interval])) or sum(namespace:tandem_router_rejections:rate1m"
                      f"{{{NS}}})", "{{reason}}")], unit="reqps"),
        panel("Admission queue", "Requests waiting in the routers' admission queues",
              [target(f"sum(namespace:tandem_router_admission_queue_requests:sum{{{NS}}})",
                      "queued")]),
        panel("Admission queue wait", "Time a queued request waited before it started (no "
              "value while none was queued)",
              quantiles("tandem_router_admission_queue_seconds", NS, (0.5, 0.99)), unit="s"),
        panel("TTFT prediction error", "(observed - predicted) / predicted time to first token, "
              "for the requests the slo policy predicted: 0 is exact, > 0 slower than predicted",
              [target(f"namespace:tandem_router_ttft_prediction_error_ratio:quantile1m{{{NS}}}",
                      "p{{quantile}}")], unit="percentunit"),
        panel("TPOT prediction error", "(observed - predicted) / predicted time per output token",
              [target(f"namespace:tandem_router_tpot_prediction_error_ratio:quantile1m{{{NS}}}",
                      "p{{quantile}}")], unit="percentunit"),
        panel("Latency corrections", "Factor the slo policy multiplies each worker's predictions "
              "by, learned from observed latencies; 1 is none",
              [target(f"max by (worker, kind) (tandem_router_latency_correction"
                      f"{{{ROUTER_WORKER}}})", "{{worker}} {{kind}}")]),
        panel("TTFT correction by priority", "The TTFT factor of each priority class of requests "
              "on each worker; 1 is none",
              [target(f"max by (worker, priority) (tandem_router_ttft_correction_by_priority"
                      f"{{{ROUTER_WORKER}}})", "{{worker}} priority {{priority}}")]),
        panel("Step speed", "Observed over predicted duration of each worker's latest engine "
              "steps; 1 is as fitted",
              [target(f"max by (worker) (tandem_router_step_speed_ratio{{{ROUTER_WORKER}}})",
                      "{{worker}}")]),
        panel("Migrations", "Requests moved to another decode worker per second, by reason (0: "
              "none moved)",
              [target(f"sum by (reason) (rate(tandem_router_migrations_total{{{NS}}}"
                      f"[$__rate_interval])) or sum(namespace:tandem_router_migrations:rate1m"
                      f"{{{NS}}})", "{{reason}}")], unit="reqps"),
        panel("Worker health", "1 while a router takes requests to the worker (by address)",
              [target(f"min by (worker) (tandem_router_worker_healthy{{{NS}}})", "{{worker}}")]),
        panel("Router overhead", "The router's own work per request: hashing, placement, "
              "starting the relay",
              quantiles("tandem_router_overhead_seconds", NS, (0.5, 0.99)), unit="s"),
        panel("Time to first token", "Arrival at the router to the first token relayed",
              [target(f"namespace:tandem_router_ttft_seconds:quantile1m{{{NS}}}",
                      "p{{quantile}}")], unit="s"),
    ])


def kv_transfer_dashboard():
    return dashboard("tandem-kv-transfer", "Tandem / KV transfer",
                     "KV moved from prefill to decode workers, and what the prefix caches saved", [
        panel("Bandwidth", "KV bytes written into decode workers' pools per second, in all",
              [target(f"sum(namespace:tandem_prefill_transfer_bytes:rate1m{{{NS}}})",
                      "prefill -> decode")], unit="Bps"),
        panel("Bandwidth by prefill worker", "KV bytes each prefill worker wrote per second",
              [target(f'namespace_pod:tandem_prefill_transfer_bytes:rate1m{{{NS}, '
                      f'pod=~"$worker"}}', "{{pod}}")], unit="Bps"),
        panel("Prefill to KV in place", "Arrival at the prefill worker to its last KV write in "
              "place (compute and transfer overlap)",
              [target(f"namespace:tandem_prefill_transfer_seconds:quantile1m{{{NS}}}",
                      "p{{quantile}}")], unit="s"),
        panel("KV per remote prefill", "Bytes written per successful remote prefill",
              [target(f"sum(rate(tandem_prefill_transfer_bytes_total{{{NS}}}[$__rate_interval])) "
                      f'/ sum(rate(tandem_prefill_requests_total{{{NS}, outcome="ok"}}'
                      "[$__rate_interval]))", "bytes / prefill")], unit="bytes"),
        panel("Remote and local prefill", "Placements per second by where the prompt is "
              "prefilled",
              [target(f"sum by (prefill) (namespace:tandem_router_placements:rate1m{{{NS}}})",
                      "{{prefill}}")], stack=True),
        panel("Remote prefills", "Prefill requests per second by outcome",
              [target(f"sum by (outcome) (namespace:tandem_prefill_requests:rate1m{{{NS}}})",
                      "{{outcome}}")], unit="reqps"),
        panel("KV prefix hit rate", "Share of prompt tokens that no worker had to compute (and "
              "no transfer had to carry)",
              [target(f"namespace:tandem_kv_prefix_hit:ratio_rate1m{{{NS}}}", "cluster")],
              unit="percentunit"),
        panel("Prompt tokens by pool", "Prompt tokens received per second by each pool (the "
              "prefill pool's are the decode pool's uncached remainders)",
              [target(f'namespace_pool:tandem_worker_prompt_tokens:rate1m{{{NS}, '
                      f'pool=~"$pool"}}', "{{pool}}")]),
    ])


def all_dashboards():
    """{file name: dashboard}."""
    boards = [overview(), pool_dashboard("prefill"), pool_dashboard("decode"), router_dashboard(),
              kv_transfer_dashboard()]
    return {f"{b['uid']}.json": b for b in boards}


def render(board):
    return json.dumps(board, indent=2, sort_keys=False) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a file differs from its definition here")
    parser.add_argument("--out", type=pathlib.Path, default=OUT_DIR,
                        help=f"the folder of the JSON files (default {OUT_DIR})")
    args = parser.parse_args(argv)
    stale = []
    for name, board in all_dashboards().items():
        path = args.out / name
        text = render(board)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print("out of date (run deploy/grafana/dashboards.py): " + ", ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
