"""The tables printed at the end of a run: one column per rate; an A/B comparison puts the two
configurations side by side for each rate, with the ratio B/A."""
import math


def _figures(point):
    """(name, value) rows of one rate's summary; values are numbers or None."""
    s = point["summary"]
    rows = [("requests ok", s["completed"]), ("requests failed", s["failed"]),
            ("duration (s)", s["duration_s"]),
            ("request throughput (req/s)", s["request_throughput"]),
            ("output throughput (tok/s)", s["output_throughput"])]
    for key, title in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"),
                       ("e2e_ms", "E2E")):
        for stat in ("mean", "p50", "p90", "p99"):
            rows.append((f"{title} {stat} (ms)", s[key][stat]))
    if "slo_attainment" in s:
        rows.append(("SLO attainment (%)", None if s["slo_attainment"] is None
                     else 100 * s["slo_attainment"]))
        rows.append(("goodput (req/s met SLO)", s["goodput"]))
        for name, c in (s.get("slo_classes") or {}).items():
            rows.append((f"  class {name} attainment (%)", 100 * c["attainment"]))
    hit = (point.get("prefix_hit") or {}).get("rate")
    if point.get("prefix_hit") is not None:
        rows.append(("prefix hit rate, workers (%)", None if hit is None else 100 * hit))
    # The workers' counters are the reference; the per-request share from the gRPC usage is shown
    # when they could not be read.
    if s.get("cached_prompt_share") is not None and hit is None:
        rows.append(("cached prompt share, usage (%)", 100 * s["cached_prompt_share"]))
    return rows


def fmt(value):
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "inf"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def rate_text(rate):
    return "inf" if math.isinf(rate) else f"{rate:g}"


def _table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate([header] + rows):
        cells = [str(c).ljust(widths[i]) if i == 0 else str(c).rjust(widths[i])
                 for i, c in enumerate(row)]
        lines.append("  ".join(cells))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def goodput_line(run):
    g = run.get("distserve_goodput") or {}
    target = 100 * g.get("target", 0.9)
    if g.get("bound") == "interpolated":
        lo, hi = g["between"]
        return (f"DistServe goodput ({target:g}% attainment): {g['goodput']:.3g} req/s "
                f"(interpolated between {lo:g} and {hi:g} req/s)")
    if g.get("bound") == "at_least":
        return (f"DistServe goodput ({target:g}% attainment): >= {g['goodput']:g} req/s "
                "(every swept rate met the target; sweep higher)")
    if g.get("bound") == "below_range":
        return (f"DistServe goodput ({target:g}% attainment): < {g['lowest_rate']:g} req/s "
                "(even the lowest swept rate missed the target; sweep lower)")
    return None


def run_table(run):
    """One configuration: a column per rate."""
    points = run["rates"]
    names = [name for name, _ in _figures(points[0])]
    columns = [dict(_figures(p)) for p in points]
    rows = [[name] + [fmt(col.get(name)) for col in columns] for name in names]
    header = [f"{run['label']}: rate (req/s)"] + [rate_text(p["rate"]) for p in points]
    text = _table(header, rows)
    line = goodput_line(run)
    return text + ("\n" + line if line else "")


def ab_table(run_a, run_b):
    """Two configurations: for each rate, A, B and B/A."""
    blocks = []
    for pa, pb in zip(run_a["rates"], run_b["rates"]):
        fa, fb = _figures(pa), dict(_figures(pb))
        rows = []
        for name, va in fa:
            vb = fb.get(name)
            ratio = (vb / va if isinstance(va, (int, float)) and isinstance(vb, (int, float))
                     and va else None)
            rows.append([name, fmt(va), fmt(vb), "-" if ratio is None else f"{ratio:.2f}x"])
        header = [f"rate {rate_text(pa['rate'])} req/s", f"A: {run_a['label']}",
                  f"B: {run_b['label']}", "B/A"]
        blocks.append(_table(header, rows))
    for run, side in ((run_a, "A"), (run_b, "B")):
        line = goodput_line(run)
        if line:
            blocks.append(f"{side} ({run['label']}): {line}")
    return "\n\n".join(blocks)
