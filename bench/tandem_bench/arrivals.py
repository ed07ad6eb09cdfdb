"""When requests are sent: seeded open-loop arrival processes.

An arrival process turns a rate (requests/s) into a schedule of send times, in seconds from the
start of a run. The schedule never depends on how fast the server answers (open loop): a slow
server faces the same arrivals as a fast one.

  poisson   exponential gaps with mean 1/rate (coefficient of variation 1)
  gamma     Gamma gaps with shape = burstiness and mean 1/rate, as `vllm bench serve --burstiness`:
            the coefficient of variation of the gaps is 1/sqrt(burstiness), so burstiness 1 is
            Poisson, < 1 is burstier and > 1 is more regular
  constant  every gap is exactly 1/rate

A rate of infinity sends every request at time 0.
"""
import dataclasses
import math
import zlib

import numpy as np

KINDS = ("poisson", "gamma", "constant")


def rng_for(seed, *labels):
    """A numpy Generator for one purpose of a seeded run: the same (seed, labels) always gives the
    same stream, and different labels give independent streams."""
    words = [int(seed) & 0xFFFFFFFF]
    words += [zlib.crc32(str(label).encode()) for label in labels]
    return np.random.default_rng(np.random.SeedSequence(words))


@dataclasses.dataclass(frozen=True)
class ArrivalProcess:
    """One arrival process. `rate` is in requests/s (math.inf: all at once); `burstiness` is the
    Gamma shape and must be 1 for "poisson" and "constant"."""
    kind: str
    rate: float
    burstiness: float = 1.0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown arrival process '{self.kind}' (one of {', '.join(KINDS)})")
        if not self.rate > 0:
            raise ValueError(f"the rate must be positive, not {self.rate}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ValueError(f"the burstiness must be a positive number, not {self.burstiness}")
        if self.kind != "gamma" and self.burstiness != 1.0:
            raise ValueError(f"burstiness {self.burstiness} needs the gamma arrival process")

    def gaps(self, rng, count):
        """`count` gaps between consecutive arrivals, in seconds (a numpy array)."""
        if math.isinf(self.rate):
            return np.zeros(count)
        mean = 1.0 / self.rate
        if self.kind == "constant":
            return np.full(count, mean)
        if self.kind == "poisson":
            return rng.exponential(mean, count)
        return rng.gamma(self.burstiness, mean / self.burstiness, count)


def schedule(process, rng, num_requests=None, duration_s=None):
    """Send times in seconds from the start, ascending; the first request goes at 0 and each next
    one a gap later. Exactly one of `num_requests` (that many requests) or `duration_s` (every
    arrival before that time; needs a finite rate) is given."""
    if (num_requests is None) == (duration_s is None):
        raise ValueError("give exactly one of num_requests and duration_s")
    if num_requests is not None:
        if num_requests < 1:
            raise ValueError("num_requests must be at least 1")
        gaps = process.gaps(rng, num_requests - 1)
        return [0.0] + np.cumsum(gaps).tolist()
    if math.isinf(process.rate):
        raise ValueError("a duration needs a finite rate")
    if not duration_s > 0:
        raise ValueError("duration_s must be positive")
    times = [0.0]
    # Draw gaps in blocks until the schedule passes the duration; the draws are the same as one
    # long draw, so a longer duration extends a shorter one's schedule.
    block = max(16, int(duration_s * process.rate * 1.2) + 16)
    while True:
        for gap in process.gaps(rng, block):
            t = times[-1] + float(gap)
            if t >= duration_s:
                return times
            times.append(t)
