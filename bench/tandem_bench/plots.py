"""PNG figures of one or more runs (an A/B comparison plots both sides on the same axes).

  latency_cdf.png         CDFs of TTFT, TPOT, inter-token latency and E2E, one line per run and rate
  latency_vs_rate.png     p50 / p90 / p99 of TTFT, TPOT and E2E against the offered rate
  attainment_vs_rate.png  SLO attainment against the offered rate, the target line and each run's
                          DistServe goodput (only when requests had SLOs)

and, called on their own, predicted_vs_observed (one run's latency predictions, request by
request).

A run here is a dict as in the result JSON: {"label", "rates": [{"rate", "summary",
"requests"}], "distserve_goodput"}. Infinite rates are left out of the "versus rate" figures.
"""
import math
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_CDF_METRICS = (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("itl_ms", "inter-token latency (ms)"),
                ("e2e_ms", "end-to-end latency (ms)"))
_RATE_METRICS = (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("e2e_ms", "E2E (ms)"))
_STYLES = {"p50": "-", "p90": "--", "p99": ":"}


def _rate_label(rate):
    return "inf" if math.isinf(rate) else f"{rate:g}"


def _values(requests, key):
    if key == "itl_ms":
        return sorted(x for r in requests if r.get("ok") for x in (r.get("itl_ms") or []))
    return sorted(r[key] for r in requests if r.get("ok") and r.get(key) is not None)


def latency_cdf(runs, path):
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    many = len(runs) > 1
    for ax, (key, title) in zip(axes.flat, _CDF_METRICS):
        for run_i, run in enumerate(runs):
            for point in run["rates"]:
                values = _values(point["requests"], key)
                if not values:
                    continue
                xs = [values[0]] + values
                ys = [0.0] + [(i + 1) / len(values) for i in range(len(values))]
                label = f"{run['label']} @ {_rate_label(point['rate'])}/s" if many else \
                    f"{_rate_label(point['rate'])} req/s"
                ax.step(xs, ys, where="post", label=label,
                        linestyle="-" if run_i == 0 else "--")
        ax.set_xlabel(title)
        ax.set_ylabel("fraction of token gaps" if key == "itl_ms" else "fraction of requests")
        ax.set_ylim(0, 1.02)
        _grid_and_legend(ax)
    fig.suptitle("latency CDFs")
    _save(fig, path)


def _grid_and_legend(ax):
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _finite(run):
    return [p for p in run["rates"] if math.isfinite(p["rate"])]


def latency_vs_rate(runs, path):
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, title) in zip(axes, _RATE_METRICS):
        for run_i, run in enumerate(runs):
            points = _finite(run)
            rates = [p["rate"] for p in points]
            for q, style in _STYLES.items():
                ys = [p["summary"][key][q] for p in points]
                if all(y is None for y in ys):
                    continue
                ax.plot(rates, [math.nan if y is None else y for y in ys], style, marker="o",
                        color=colors[run_i % len(colors)], label=f"{run['label']} {q}")
        ax.set_xlabel("offered rate (requests/s)")
        ax.set_ylabel(title)
        _grid_and_legend(ax)
    fig.suptitle("latency percentiles versus rate")
    _save(fig, path)


def attainment_vs_rate(runs, path, target):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for run_i, run in enumerate(runs):
        points = [p for p in _finite(run) if p["summary"].get("slo_attainment") is not None]
        color = colors[run_i % len(colors)]
        ax.plot([p["rate"] for p in points], [100 * p["summary"]["slo_attainment"] for p in points],
                marker="o", color=color, label=run["label"])
        goodput = (run.get("distserve_goodput") or {}).get("goodput")
        if goodput is not None:
            ax.axvline(goodput, color=color, linestyle=":",
                       label=f"{run['label']} goodput {goodput:.3g}/s")
    ax.axhline(100 * target, color="gray", linestyle="--", label=f"target {100 * target:g}%")
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_ylabel("SLO attainment (%)")
    ax.set_ylim(0, 102)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("SLO attainment versus rate")
    _save(fig, path)


def predicted_vs_observed(run, path):
    """Each request's observed TTFT and TPOT against what placement predicted for it (log-log),
    with the diagonal and the +-20% band; requests without predictions are left out."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    for ax, (key, title) in zip(axes, (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"))):
        rows = [(r.get("slo_class") or "", r[f"predicted_{key}"], r[key])
                for point in run["rates"] for r in point["requests"]
                if r.get("ok") and r.get(key) and r.get(f"predicted_{key}")]
        if not rows:
            continue
        for name in sorted({c for c, _, _ in rows}):
            ax.scatter([x for c, x, _ in rows if c == name], [y for c, _, y in rows if c == name],
                       s=4, alpha=0.35, label=name or "requests")
        pairs = [(x, y) for _, x, y in rows]
        low = min(min(p) for p in pairs)
        high = max(max(p) for p in pairs)
        line = [low, high]
        ax.plot(line, line, color="black", linewidth=1, label="observed = predicted")
        ax.plot(line, [v / 0.8 for v in line], color="gray", linestyle="--", linewidth=1,
                label="error +-20% of observed")
        ax.plot(line, [v / 1.2 for v in line], color="gray", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"predicted {title}")
        ax.set_ylabel(f"observed {title}")
        ax.set_title(f"{title}: observed against predicted")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, markerscale=3)
    _save(fig, path)


def write_all(runs, directory, target=0.9):
    """Writes the figures that the runs have data for into `directory`; returns their paths."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    path = directory / "latency_cdf.png"
    latency_cdf(runs, path)
    written.append(path)
    if any(_finite(run) for run in runs):
        path = directory / "latency_vs_rate.png"
        latency_vs_rate(runs, path)
        written.append(path)
        if any(p["summary"].get("slo_attainment") is not None for run in runs for p in _finite(run)):
            path = directory / "attainment_vs_rate.png"
            attainment_vs_rate(runs, path, target)
            written.append(path)
    return written
