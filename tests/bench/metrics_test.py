"""The figures on hand-made timings: percentiles against numpy's, TPOT, throughput, SLO attainment,
both kinds of goodput, and the DistServe interpolation."""
import math

import numpy as np
import pytest

from tandem_bench import metrics


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
def test_percentiles_match_numpy(n):
    rng = np.random.default_rng(n)
    values = rng.lognormal(3, 1, n).tolist()
    if n > 3:
        values[1] = values[2]  # ties
    for q in (0, 1, 25, 50, 90, 99, 99.9, 100):
        assert metrics.percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-12)


def test_percentile_edges():
    assert metrics.percentile([], 50) is None
    assert metrics.percentile([5.0], 99) == 5.0
    # Halfway between the two middle values, as numpy's "linear" method.
    assert metrics.percentile([4, 1, 3, 2], 50) == 2.5
    with pytest.raises(ValueError):
        metrics.percentile([1.0], 101)


def test_tpot_definition():
    # (E2E - TTFT) / (output tokens - 1): 9 gaps after the first token over 900 ms.
    assert metrics.tpot_ms(1000.0, 100.0, 10) == pytest.approx(100.0)
    assert metrics.tpot_ms(300.0, 100.0, 2) == pytest.approx(200.0)
    assert metrics.tpot_ms(300.0, 100.0, 1) is None
    assert metrics.tpot_ms(None, 100.0, 5) is None


def rec(ttft, e2e, tokens, ok=True, ttft_slo=None, tpot_slo=None, cls=None, prompt=10, itl=None):
    return {"ok": ok, "ttft_ms": ttft if ok else None, "e2e_ms": e2e if ok else None,
            "tpot_ms": metrics.tpot_ms(e2e, ttft, tokens) if ok else None,
            "itl_ms": itl or [], "output_tokens": tokens if ok else 0, "prompt_tokens": prompt,
            "ttft_slo_ms": ttft_slo, "tpot_slo_ms": tpot_slo, "slo_class": cls,
            "error": None if ok else "HTTP 429: busy"}


def test_summary_on_hand_made_records():
    records = [
        rec(100, 1000, 10, ttft_slo=200, tpot_slo=100, itl=[50, 150]),  # TPOT 100: meets (<=)
        rec(300, 1200, 10, ttft_slo=200, tpot_slo=100, itl=[80]),       # TTFT 300 > 200: miss
        rec(150, 2150, 11, ttft_slo=200, tpot_slo=100),                 # TPOT 200 > 100: miss
        rec(50, 50, 1, ttft_slo=200, tpot_slo=100),                     # one token: TPOT holds
        rec(0, 0, 0, ok=False, ttft_slo=200, tpot_slo=100),             # failed: a miss
    ]
    s = metrics.summarize(records, duration_s=4.0)
    assert (s["requests"], s["completed"], s["failed"]) == (5, 4, 1)
    assert s["errors"] == {"HTTP 429: busy": 1}
    assert s["request_throughput"] == pytest.approx(4 / 4.0)
    assert s["output_throughput"] == pytest.approx((10 + 10 + 11 + 1) / 4.0)
    ttfts = [100, 300, 150, 50]
    assert s["ttft_ms"]["mean"] == pytest.approx(np.mean(ttfts))
    for q in (50, 90, 99):
        assert s["ttft_ms"][f"p{q}"] == pytest.approx(np.percentile(ttfts, q))
        assert s["e2e_ms"][f"p{q}"] == pytest.approx(np.percentile([1000, 1200, 2150, 50], q))
    # TPOT of the three requests with more than one token.
    assert s["tpot_ms"]["count"] == 3
    assert s["tpot_ms"]["p50"] == pytest.approx(np.percentile([100, 100, 200], 50))
    assert s["itl_ms"]["count"] == 3 and s["itl_ms"]["mean"] == pytest.approx(np.mean([50, 150, 80]))
    assert s["slo_met"] == 2
    assert s["slo_attainment"] == pytest.approx(2 / 5)
    assert s["goodput"] == pytest.approx(2 / 4.0)


def test_attainment_per_class_and_requests_without_targets():
    records = [rec(100, 500, 5, ttft_slo=150, cls="chat"), rec(200, 600, 5, ttft_slo=150, cls="chat"),
               rec(900, 9000, 5, tpot_slo=5000, cls="batch"), rec(1, 2, 2, cls="none")]
    s = metrics.summarize(records, duration_s=2.0)
    assert s["slo_classes"]["chat"] == {"requests": 2, "met": 1, "attainment": 0.5, "goodput": 0.5}
    assert s["slo_classes"]["batch"]["attainment"] == 1.0
    # A request with no target meets its (empty) objectives.
    assert s["slo_classes"]["none"]["attainment"] == 1.0
    assert s["slo_attainment"] == pytest.approx(3 / 4)


def test_no_slo_no_attainment():
    s = metrics.summarize([rec(1, 2, 2)], duration_s=1.0)
    assert "slo_attainment" not in s and "goodput" not in s


def test_all_failed():
    s = metrics.summarize([rec(0, 0, 0, ok=False, ttft_slo=1)] * 3, duration_s=1.0)
    assert s["completed"] == 0 and s["ttft_ms"]["p50"] is None and s["slo_attainment"] == 0.0


def test_distserve_goodput_interpolates_between_swept_rates():
    g = metrics.distserve_goodput([1, 2, 4], [1.0, 0.95, 0.5], target=0.9)
    # Between 2 (95%) and 4 (50%): 2 + (0.95 - 0.9) * (4 - 2) / (0.95 - 0.5).
    assert g["bound"] == "interpolated" and g["between"] == [2, 4]
    assert g["goodput"] == pytest.approx(2 + 0.05 * 2 / 0.45)


def test_distserve_goodput_exactly_at_target_and_unsorted_input():
    g = metrics.distserve_goodput([8, 2, 4], [0.2, 1.0, 0.9], target=0.9)
    # 4 req/s has exactly 90%: still meets it; the crossing lies between 4 and 8 and starts at 4.
    assert g["between"] == [4, 8] and g["goodput"] == pytest.approx(4.0)


def test_distserve_goodput_takes_the_first_crossing():
    g = metrics.distserve_goodput([1, 2, 3, 4], [1.0, 0.8, 0.95, 0.5], target=0.9)
    assert g["between"] == [1, 2] and g["goodput"] == pytest.approx(1 + 0.1 / 0.2)


def test_distserve_goodput_bounds():
    assert metrics.distserve_goodput([1, 2], [0.99, 0.95]) == {"goodput": 2, "bound": "at_least",
                                                              "target": 0.9}
    low = metrics.distserve_goodput([1, 2], [0.5, 0.1])
    assert low["goodput"] is None and low["bound"] == "below_range" and low["lowest_rate"] == 1
    assert metrics.distserve_goodput([1, 2], [None, None])["goodput"] is None
    # An infinite rate is no point on the rate axis.
    g = metrics.distserve_goodput([1, 2, math.inf], [1.0, 1.0, 0.0])
    assert g["bound"] == "at_least" and g["goodput"] == 2
