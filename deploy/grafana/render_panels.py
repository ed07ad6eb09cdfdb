#!/usr/bin/env python3
"""Render the main panels of the Tandem dashboards to PNGs from a Prometheus server.

Reads the dashboards' JSON (deploy/grafana/dashboards/), resolves their template variables the
way Grafana would (each variable's label_values() query, its regex, every value chosen), runs
each chosen panel's queries over a time range through Prometheus' HTTP API (query_range) and
draws them with matplotlib, one PNG per dashboard:

    python3 deploy/grafana/render_panels.py --prometheus http://127.0.0.1:9090 --out DIR \
        [--minutes 10 | --start UNIX --end UNIX] [--var namespace=NS]

tests/deploy/monitoring_live_test.py uses the same functions to evaluate every panel query of a
live cluster, and docs/images/monitoring/ holds the PNGs of one such run.
"""
import argparse
import json
import pathlib
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

DASHBOARD_DIR = pathlib.Path(__file__).resolve().parent / "dashboards"

# Grafana's built-in variables that the queries may use, with the values this script gives them
# (what Grafana computes for a 15 s scrape interval over a short range).
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}

# Variable references in a query: $name, ${name}, ${name:format}, [[name]].
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<match>.*),\s*(?P<label>\w+)\s*\)\s*$", re.S)

# The panels drawn, by dashboard uid: (file stem of the PNG, panel titles).
MAIN_PANELS = {
    "tandem-overview": ("overview", ["Requests", "Goodput", "SLO attainment",
                                     "Time to first token", "Time per output token",
                                     "KV prefix hit rate", "KV cache usage",
                                     "KV transfer bandwidth"]),
    "tandem-router": ("router", ["Placements", "Admission", "TTFT prediction error",
                                 "TPOT prediction error", "Latency corrections", "Step speed"]),
    "tandem-prefill": ("prefill", ["Prompt tokens", "Prefix hit rate", "Engine step time",
                                   "KV written"]),
    "tandem-decode": ("decode", ["Computed tokens", "Sequences", "KV blocks", "Batch size"]),
    "tandem-kv-transfer": ("kv_transfer", ["Bandwidth", "Prefill to KV in place",
                                           "KV per remote prefill", "Remote and local prefill"]),
}


class QueryError(RuntimeError):
    """Prometheus refused a query (its error type and message), or could not be reached."""


class Prometheus:
    """A client of Prometheus' HTTP API (/api/v1/...)."""

    def __init__(self, url, timeout_s=30.0):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def get(self, path, params):
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}",
                                        timeout=self.timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as e:
            try:
                body = json.loads(e.read())
            except ValueError:
                raise QueryError(f"{path}: HTTP {e.code}") from e
        except (OSError, ValueError) as e:
            raise QueryError(f"{path}: {e}") from e
        if body.get("status") != "success":
            raise QueryError(f"{body.get('errorType')}: {body.get('error')} ({params})")
        return body["data"]

    def query(self, expr, at=None):
        """An instant query: the result list of {"metric", "value": [t, "v"]}."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.get("/api/v1/query", params)["result"]

    def query_range(self, expr, start, end, step):
        """A range query: the result list of {"metric", "values": [[t, "v"], ...]}."""
        return self.get("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}",
                                                "end": f"{end:.3f}", "step": f"{step:g}"})["result"]

    def label_values(self, match, label, start, end):
        return self.get(f"/api/v1/label/{label}/values",
                        {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"})


def load_dashboards(directory=DASHBOARD_DIR):
    """{uid: dashboard} of every *.json file in `directory`."""
    boards = {}
    for path in sorted(pathlib.Path(directory).glob("*.json")):
        board = json.loads(path.read_text(encoding="utf-8"))
        boards[board["uid"]] = board
    return boards


def panels_of(board):
    """Every panel, those inside collapsed rows included."""
    for p in board.get("panels", []):
        yield p
        yield from p.get("panels", [])


def referenced_variables(text):
    """The names of the variables `text` refers to."""
    return {next(g for g in m.groups() if g) for m in _VARIABLE.finditer(text)}


def substitute(text, values):
    """`text` with every variable replaced by values[name] (or a built-in's value). Raises
    KeyError naming a variable that has no value."""
    def value(m):
        name = next(g for g in m.groups() if g)
        if name in values:
            return values[name]
        if name in BUILTINS:
            return BUILTINS[name]
        raise KeyError(f"variable ${name} has no value")
    return _VARIABLE.sub(value, text)


def _variable_regex(variable):
    regex = variable.get("regex") or ""
    if regex.startswith("/") and regex.rfind("/") > 0:
        regex = regex[1:regex.rfind("/")]
    return re.compile(regex) if regex else None


def resolve_variables(client, board, start, end, chosen=None):
    """{name: the value Grafana puts in the queries}: chosen[name] where given (it must be one
    of the variable's values), else every value of a multi-value variable, else its first. One
    value stands as itself, several as (a|b) (Grafana's regex format for several values).
    Raises QueryError for a variable whose query finds no value, or not the chosen one."""
    chosen = chosen or {}
    values = {}
    for variable in board["templating"]["list"]:
        name = variable["name"]
        if variable["type"] == "datasource":
            values[name] = variable.get("current", {}).get("value") or "prometheus"
            continue
        if variable["type"] != "query":
            raise QueryError(f"{board['uid']}: variable {name} is a {variable['type']}, which "
                             "this script does not resolve")
        query = variable["query"]["query"] if isinstance(variable["query"], dict) \
            else variable["query"]
        m = _LABEL_VALUES.match(query)
        if m is None:
            raise QueryError(f"{board['uid']}: variable {name}: only label_values(match, label) "
                             f"queries are resolved, not {query!r}")
        found = client.label_values(substitute(m.group("match"), values), m.group("label"),
                                    start, end)
        regex = _variable_regex(variable)
        found = sorted(v for v in found if regex is None or regex.search(v))
        if not found:
            raise QueryError(f"{board['uid']}: variable {name} ({query}) found no value")
        if name in chosen:
            if chosen[name] not in found:
                raise QueryError(f"{board['uid']}: variable {name} has no value {chosen[name]!r} "
                                 f"(it has {found})")
            found = [chosen[name]]
        elif not variable.get("multi") and not variable.get("includeAll"):
            found = found[:1]
        values[name] = found[0] if len(found) == 1 else "(" + "|".join(found) + ")"
    return values


def panel_queries(board, values):
    """(panel, refId, expression with the variables substituted) of every query of every panel."""
    for p in panels_of(board):
        for t in p.get("targets", []):
            yield p, t.get("refId", ""), substitute(t["expr"], values)


def _scale(unit):
    """(factor, axis label) for a Grafana unit."""
    return {"s": (1e3, "ms"), "percentunit": (100.0, "%"), "Bps": (1e-6, "MB/s"),
            "bytes": (1e-6, "MB"), "reqps": (1.0, "requests/s")}.get(unit, (1.0, ""))


def _legend(fmt, metric):
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt or "")
    return text or json.dumps(metric, sort_keys=True)


def render(client, boards, out_dir, start, end, step=None, panels=MAIN_PANELS, chosen=None):
    """Draw `panels` of `boards` over [start, end] into out_dir/<stem>.png, with the variables
    resolved by resolve_variables(chosen); the paths written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    step = step or max(1.0, round((end - start) / 200.0))
    written = []
    for uid, (stem, titles) in panels.items():
        board = boards[uid]
        values = resolve_variables(client, board, start, end, chosen)
        by_title = {p["title"]: p for p in panels_of(board)}
        missing = [t for t in titles if t not in by_title]
        if missing:
            raise KeyError(f"{uid} has no panel titled {missing}")
        cols = 2
        rows = (len(titles) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(10, 2.3 * rows), squeeze=False)
        for ax, title in zip(axes.flat, titles):
            p = by_title[title]
            factor, label = _scale(p.get("fieldConfig", {}).get("defaults", {}).get("unit", ""))
            for t in p["targets"]:
                for series in client.query_range(substitute(t["expr"], values), start, end, step):
                    xs = [float(ts) - start for ts, _ in series["values"]]
                    ys = [float(v) * factor for _, v in series["values"]]
                    ax.plot(xs, ys, linewidth=1.2, label=_legend(t.get("legendFormat"),
                                                                 series["metric"]))
            ax.set_title(title, fontsize=9)
            ax.set_ylabel(label, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if ax.get_lines():
                ax.legend(fontsize=6, loc="upper left", ncol=2)
        for ax in list(axes.flat)[len(titles):]:
            ax.axis("off")
        for ax in axes[-1]:
            ax.set_xlabel("seconds", fontsize=8)
        fig.suptitle(board["title"], fontsize=10)
        fig.tight_layout()
        path = out_dir / f"{stem}.png"
        fig.savefig(path, dpi=72)
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True, help="Prometheus' URL, http://host:port")
    parser.add_argument("--out", required=True, type=pathlib.Path, help="folder for the PNGs")
    parser.add_argument("--dashboards", type=pathlib.Path, default=DASHBOARD_DIR,
                        help=f"folder of the dashboards' JSON (default {DASHBOARD_DIR})")
    parser.add_argument("--minutes", type=float, default=10.0,
                        help="the range: the last N minutes (default 10)")
    parser.add_argument("--start", type=float, help="start of the range, Unix seconds")
    parser.add_argument("--end", type=float, help="end of the range, Unix seconds")
    parser.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable's value, e.g. namespace=local (default: the first "
                        "namespace, every pool and worker)")
    args = parser.parse_args(argv)
    chosen = {}
    for item in args.var:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            parser.error(f"--var {item!r}: expected NAME=VALUE")
        chosen[name] = value
    end = args.end if args.end is not None else time.time()
    start = args.start if args.start is not None else end - args.minutes * 60
    if not start < end:
        parser.error("the range is empty: --start must be before --end")
    try:
        for path in render(Prometheus(args.prometheus), load_dashboards(args.dashboards),
                           args.out, start, end, chosen=chosen):
            print(path)
    except (QueryError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
