"""The figures of a run, from per-request records (docs/bench.md defines each one).

A record is a dict as written to the result JSON: ok, ttft_ms, tpot_ms, e2e_ms, itl_ms (a list),
output_tokens, prompt_tokens, ttft_slo_ms, tpot_slo_ms, slo_class, ... (see runner.record).

  TPOT         (e2e - ttft) / (output_tokens - 1), per request; undefined with one output token
  percentiles  linear interpolation between closest ranks (numpy's default "linear" method)
  attainment   the share of all requests (failed ones included, as misses) that succeeded with
               TTFT <= its TTFT target and TPOT <= its TPOT target (a missing target always holds;
               so does the TPOT target of a one-token answer)
  goodput      (a) requests/s that met their SLOs: met / duration, as `vllm bench serve --goodput`
               (b) the highest rate whose attainment is >= a target (90%), from a sweep, as
                   DistServe: see distserve_goodput
"""
import math

PERCENTILES = (50, 90, 99)


def percentile(values, q):
    """The q-th percentile (0 <= q <= 100) of `values` with linear interpolation between the
    closest ranks: position p = (n - 1) q / 100, then v[floor(p)] + (p - floor(p)) (v[ceil(p)] -
    v[floor(p)]) over the sorted values. None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not in [0, 100]")
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


def tpot_ms(e2e_ms, ttft_ms, output_tokens):
    """Time per output token after the first; None when it is undefined (fewer than 2 tokens)."""
    if e2e_ms is None or ttft_ms is None or output_tokens is None or output_tokens < 2:
        return None
    return (e2e_ms - ttft_ms) / (output_tokens - 1)


def distribution(values):
    """mean, p50, p90, p99, min, max and count of a list of numbers (Nones for an empty list)."""
    values = [v for v in values if v is not None]
    out = {"count": len(values), "mean": sum(values) / len(values) if values else None}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(values, q)
    out["min"] = min(values) if values else None
    out["max"] = max(values) if values else None
    return out


def met_slo(record):
    """Whether one request met both of its targets; a failed request never does."""
    if not record.get("ok"):
        return False
    ttft_target = record.get("ttft_slo_ms")
    if ttft_target is not None and (record.get("ttft_ms") is None or record["ttft_ms"] > ttft_target):
        return False
    tpot_target = record.get("tpot_slo_ms")
    if tpot_target is not None and record.get("tpot_ms") is not None and record["tpot_ms"] > tpot_target:
        return False
    return True


def has_slo(record):
    return record.get("ttft_slo_ms") is not None or record.get("tpot_slo_ms") is not None


def summarize(records, duration_s):
    """The figures of one rate's requests, run over `duration_s` seconds (from the first request
    sent to the last one finished)."""
    ok = [r for r in records if r.get("ok")]
    failed = [r for r in records if not r.get("ok")]
    output_tokens = sum(r.get("output_tokens") or 0 for r in ok)
    prompt_tokens = sum(r.get("prompt_tokens") or 0 for r in ok)
    duration_s = max(duration_s, 1e-9)
    summary = {
        "requests": len(records),
        "completed": len(ok),
        "failed": len(failed),
        "duration_s": duration_s,
        "request_throughput": len(ok) / duration_s,
        "output_throughput": output_tokens / duration_s,
        "total_token_throughput": (output_tokens + prompt_tokens) / duration_s,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "ttft_ms": distribution(r.get("ttft_ms") for r in ok),
        "tpot_ms": distribution(r.get("tpot_ms") for r in ok),
        "itl_ms": distribution(x for r in ok for x in (r.get("itl_ms") or [])),
        "e2e_ms": distribution(r.get("e2e_ms") for r in ok),
        "errors": _error_counts(failed),
    }
    cached = [r.get("cached_prompt_tokens") for r in ok if r.get("cached_prompt_tokens") is not None]
    if cached:
        prompt_with_cache_info = sum(r.get("prompt_tokens") or 0 for r in ok
                                     if r.get("cached_prompt_tokens") is not None)
        summary["cached_prompt_share"] = (sum(cached) / prompt_with_cache_info
                                          if prompt_with_cache_info else None)
    if any(has_slo(r) for r in records):
        met = sum(1 for r in records if met_slo(r))
        summary["slo_met"] = met
        summary["slo_attainment"] = met / len(records) if records else None
        summary["goodput"] = met / duration_s
        classes = sorted({r.get("slo_class") for r in records if r.get("slo_class")})
        if classes:
            summary["slo_classes"] = {}
            for name in classes:
                mine = [r for r in records if r.get("slo_class") == name]
                hits = sum(1 for r in mine if met_slo(r))
                summary["slo_classes"][name] = {"requests": len(mine), "met": hits,
                                                "attainment": hits / len(mine),
                                                "goodput": hits / duration_s}
    return summary


def _error_counts(failed):
    counts = {}
    for r in failed:
        message = r.get("error") or "unknown error"
        counts[message] = counts.get(message, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def distserve_goodput(rates, attainments, target=0.9):
    """The highest request rate whose SLO attainment stays >= `target`, from a sweep.

    The rates are sorted ascending. Scanning up from the lowest, the first swept rate whose
    attainment falls below the target ends the search; the goodput is interpolated linearly
    between it and the rate before it (where attainment was still >= target):
        r* = r_lo + (a_lo - target) (r_hi - r_lo) / (a_lo - a_hi)
    Returns a dict: `goodput` (requests/s or None), `bound` and, when interpolated, `between`.
      "interpolated"  target crossed between two swept rates
      "at_least"      every swept rate met the target: goodput is the highest swept rate, a
                      lower bound
      "below_range"   even the lowest swept rate missed it: goodput is None (below that rate)
    Infinite rates (all requests at once) are left out; None attainments (no SLO) give None.
    """
    points = sorted((r, a) for r, a in zip(rates, attainments) if math.isfinite(r))
    if not points or any(a is None for _, a in points):
        return {"goodput": None, "bound": "no_slo" if points else "no_finite_rate",
                "target": target}
    if points[0][1] < target:
        return {"goodput": None, "bound": "below_range", "target": target,
                "lowest_rate": points[0][0]}
    for (r_lo, a_lo), (r_hi, a_hi) in zip(points, points[1:]):
        if a_hi < target:
            rate = r_lo + (a_lo - target) * (r_hi - r_lo) / (a_lo - a_hi)
            return {"goodput": rate, "bound": "interpolated", "target": target,
                    "between": [r_lo, r_hi]}
    return {"goodput": points[-1][0], "bound": "at_least", "target": target}
