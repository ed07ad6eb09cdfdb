"""The open-loop driver: sends one rate's requests at their scheduled times and records them.

Each request is sent at its scheduled time whether or not earlier ones have answered. With a
concurrency cap, a request that arrives while the cap is reached waits here for a free slot; its
latencies are measured from when it is actually sent, and the wait is recorded as queue_ms.
"""
import asyncio
import os
import time

from . import metrics


def record(spec, outcome, scheduled_s, sent_s, rate):
    """The result-JSON record of one request (times in ms; scheduled/sent in s from the start)."""
    ms = lambda s: None if s is None else s * 1000.0  # noqa: E731
    ttft = ms(outcome.ttft_s)
    e2e = ms(outcome.e2e_s)
    out = {
        "index": spec.index,
        "rate": rate,
        "scheduled_s": scheduled_s,
        "sent_s": sent_s,
        "queue_ms": (sent_s - scheduled_s) * 1000.0,
        "ok": outcome.ok,
        "error": outcome.error,
        "status": outcome.status,
        "finish_reason": outcome.finish_reason,
        "ttft_ms": ttft,
        "e2e_ms": e2e,
        "tpot_ms": metrics.tpot_ms(e2e, ttft, outcome.output_tokens) if outcome.ok else None,
        "itl_ms": [x * 1000.0 for x in outcome.itl_s],
        "output_tokens": outcome.output_tokens,
        "output_tokens_source": outcome.output_tokens_source,
        "requested_output_tokens": spec.output_len,
        "prompt_tokens": outcome.prompt_tokens,
        "requested_input_tokens": spec.input_len,
        "cached_prompt_tokens": outcome.cached_prompt_tokens,
        "model": spec.model,
        "priority": spec.priority,
        "tenant": spec.tenant,
        "slo_class": spec.slo_class,
        "prefix_group": spec.prefix_group,
        "ttft_slo_ms": spec.ttft_slo_ms,
        "tpot_slo_ms": spec.tpot_slo_ms,
    }
    if outcome.server_ttft_s is not None:
        out["server_ttft_ms"] = ms(outcome.server_ttft_s)
        out["server_e2e_ms"] = ms(outcome.server_e2e_s)
    if outcome.server_breakdown_s is not None:
        out["server_ms"] = {k: ms(v) for k, v in outcome.server_breakdown_s.items()}
    if outcome.predicted_ttft_s is not None or outcome.predicted_tpot_s is not None:
        out["predicted_ttft_ms"] = ms(outcome.predicted_ttft_s)
        out["predicted_tpot_ms"] = ms(outcome.predicted_tpot_s)
    if outcome.decode_worker:
        out["decode_worker"] = outcome.decode_worker
        out["prefill_worker"] = outcome.prefill_worker
    out["met_slo"] = metrics.met_slo(out) if metrics.has_slo(out) else None
    return out


async def run_rate(client, specs, times, rate, max_concurrency=None, progress=None, tag="r"):
    """Sends specs[i] at times[i] seconds from now; returns (records in index order, duration in
    seconds from the first send to the last answer). `progress` is a tqdm bar (or None)."""
    assert len(specs) == len(times)
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    start = time.perf_counter()
    records = [None] * len(specs)
    first_sent = [None]
    last_done = [start]
    prefix = f"bench-{os.getpid()}-{tag}-"

    async def one(i):
        spec = specs[i]
        if slots is not None:
            await slots.acquire()
        try:
            sent = time.perf_counter() - start
            if first_sent[0] is None:
                first_sent[0] = sent
            outcome = await client.send(spec, f"{prefix}{i}")
        finally:
            if slots is not None:
                slots.release()
        last_done[0] = max(last_done[0], time.perf_counter())
        records[i] = record(spec, outcome, times[i], sent, rate)
        if progress is not None:
            progress.update(1)
            if not outcome.ok:
                progress.set_postfix_str(f"failed: {sum(1 for r in records if r and not r['ok'])}")

    tasks = []
    for i, at in enumerate(times):
        delay = at - (time.perf_counter() - start)
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    duration = (last_done[0] - start) - (first_sent[0] or 0.0)
    return records, duration


async def run_sequential(client, specs, tag="seq"):
    """Sends the specs one after another (nothing else in flight): warm-up and the unloaded
    latencies an SLO scale multiplies. Returns their records."""
    out = []
    prefix = f"bench-{os.getpid()}-{tag}-"
    for i, spec in enumerate(specs):
        outcome = await client.send(spec, f"{prefix}{i}")
        out.append(record(spec, outcome, 0.0, 0.0, 0.0))
    return out
