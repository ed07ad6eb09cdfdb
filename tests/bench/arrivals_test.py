"""Arrival processes: mean rate, burstiness (coefficient of variation of the gaps = 1/sqrt(shape)),
repeatability of a seeded schedule, duration-limited schedules, and the open-loop driver sending
on schedule whatever the server does."""
import asyncio
import math
import time

import numpy as np
import pytest

from tandem_bench import arrivals, runner, workload
from tandem_bench.clients import Outcome

N = 40_000


def gaps_of(kind, rate, burstiness=1.0, seed=7, n=N):
    process = arrivals.ArrivalProcess(kind, rate, burstiness)
    times = arrivals.schedule(process, arrivals.rng_for(seed, "test"), num_requests=n + 1)
    return np.diff(times)


@pytest.mark.parametrize("kind,burstiness", [("poisson", 1.0), ("gamma", 0.25), ("gamma", 0.5),
                                             ("gamma", 1.0), ("gamma", 4.0)])
@pytest.mark.parametrize("rate", [0.5, 20.0])
def test_mean_rate_and_coefficient_of_variation(kind, burstiness, rate):
    gaps = gaps_of(kind, rate, burstiness)
    cv = gaps.std() / gaps.mean()
    expected_cv = 1 / math.sqrt(burstiness)
    # Standard errors at N = 40,000: the mean gap's is cv/sqrt(N) (<= 1%), the CV's under 1.5%
    # even at shape 0.25 (excess kurtosis 24); 5% is more than 3 standard errors.
    assert 1 / gaps.mean() == pytest.approx(rate, rel=0.05)
    assert cv == pytest.approx(expected_cv, rel=0.05)


def test_burstier_means_more_variable_gaps():
    cvs = [np.std(g) / np.mean(g) for g in (gaps_of("gamma", 4, b) for b in (0.2, 1, 5))]
    assert cvs[0] > 1.5 > cvs[1] > 0.8 > cvs[2]


def test_constant_gaps_are_exact():
    gaps = gaps_of("constant", 8.0, n=100)
    assert np.allclose(gaps, 0.125)


def test_first_request_at_zero_and_times_ascend():
    times = arrivals.schedule(arrivals.ArrivalProcess("poisson", 3.0), arrivals.rng_for(1),
                              num_requests=50)
    assert times[0] == 0.0 and len(times) == 50
    assert all(b >= a for a, b in zip(times, times[1:]))


def test_same_seed_same_schedule_other_seed_other_schedule():
    process = arrivals.ArrivalProcess("gamma", 2.0, 0.5)
    a = arrivals.schedule(process, arrivals.rng_for(42, "arrivals", 0), num_requests=200)
    b = arrivals.schedule(process, arrivals.rng_for(42, "arrivals", 0), num_requests=200)
    c = arrivals.schedule(process, arrivals.rng_for(43, "arrivals", 0), num_requests=200)
    d = arrivals.schedule(process, arrivals.rng_for(42, "arrivals", 1), num_requests=200)
    assert a == b
    assert a != c and a != d


def test_duration_schedule():
    process = arrivals.ArrivalProcess("poisson", 10.0)
    short = arrivals.schedule(process, arrivals.rng_for(5), duration_s=100.0)
    long = arrivals.schedule(process, arrivals.rng_for(5), duration_s=300.0)
    assert all(t < 100.0 for t in short)
    # A Poisson count over 100 s at 10/s: mean 1000, standard deviation ~32.
    assert abs(len(short) - 1000) < 130
    # A longer duration extends the shorter one's schedule.
    assert long[:len(short)] == short and len(long) > len(short)


def test_infinite_rate_sends_everything_at_once():
    times = arrivals.schedule(arrivals.ArrivalProcess("poisson", math.inf), arrivals.rng_for(0),
                              num_requests=5)
    assert times == [0.0] * 5
    with pytest.raises(ValueError, match="finite rate"):
        arrivals.schedule(arrivals.ArrivalProcess("poisson", math.inf), arrivals.rng_for(0),
                          duration_s=10)


@pytest.mark.parametrize("args,message", [
    (("poisson", 1.0, 0.5), "needs the gamma"),
    (("constant", 1.0, 2.0), "needs the gamma"),
    (("uniform", 1.0), "unknown arrival"),
    (("poisson", 0.0), "positive"),
    (("gamma", 1.0, 0.0), "burstiness"),
])
def test_bad_processes_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        arrivals.ArrivalProcess(*args)


def test_schedule_needs_exactly_one_limit():
    process = arrivals.ArrivalProcess("poisson", 1.0)
    with pytest.raises(ValueError):
        arrivals.schedule(process, arrivals.rng_for(0))
    with pytest.raises(ValueError):
        arrivals.schedule(process, arrivals.rng_for(0), num_requests=3, duration_s=3)


# ------------------------------------------------------------------------------------------------
# The open-loop driver keeps to the schedule.
# ------------------------------------------------------------------------------------------------


class SlowClient:
    """A fake client whose every request takes `latency` seconds; records when each was sent and
    how many were in flight."""

    def __init__(self, latency):
        self.latency = latency
        self.sent = {}
        self.in_flight = 0
        self.most_in_flight = 0
        self.start = time.perf_counter()

    async def send(self, spec, request_id):
        self.sent[spec.index] = time.perf_counter() - self.start
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(self.latency)
        self.in_flight -= 1
        return Outcome(ok=True, ttft_s=self.latency / 2, e2e_s=self.latency, output_tokens=2,
                       output_tokens_source="usage", itl_s=[self.latency / 2])


def specs(n):
    return workload.build(workload.WorkloadConfig(workload.Lengths(4), workload.Lengths(2)), 0, n)


def test_requests_go_out_on_schedule_even_when_the_server_is_slow():
    times = [0.0, 0.05, 0.1, 0.15, 0.2, 0.25]
    client = SlowClient(latency=0.6)
    records, duration = asyncio.run(runner.run_rate(client, specs(6), times, rate=20.0))
    for i, t in enumerate(times):
        # Open loop: each send waits for its time, not for the previous answer (0.6 s later).
        assert client.sent[i] == pytest.approx(t, abs=0.1), client.sent
        assert records[i]["queue_ms"] < 100
    assert client.most_in_flight == 6
    assert duration == pytest.approx(0.25 + 0.6, abs=0.2)


def test_concurrency_cap_holds_later_arrivals():
    client = SlowClient(latency=0.2)
    records, _ = asyncio.run(runner.run_rate(client, specs(6), [0.0] * 6, rate=math.inf,
                                             max_concurrency=2))
    assert client.most_in_flight == 2
    queued = sorted(r["queue_ms"] for r in records)
    # Three waves of two: the last two waited for two earlier waves (~400 ms).
    assert queued[0] < 100 and queued[-1] == pytest.approx(400, abs=150)
