"""engine.bench.stats against numpy/scipy and against values worked out by hand."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from opscope.engine.bench.measure import stats
from scipy import stats as sps


def test_percentiles_are_numpy_linear_type_7():
    x = list(range(1, 11))  # 1..10: type 7 gives p5 = 1 + 0.05*9 = 1.45, p95 = 9.55
    p5, p25, p50, p75, p95, p99 = stats.percentiles(x)
    assert (p5, p50, p95) == pytest.approx((1.45, 5.5, 9.55))
    rng = np.random.default_rng(3)
    y = rng.lognormal(3.0, 0.4, 37)
    assert stats.percentiles(y) == pytest.approx(np.percentile(y, [5, 25, 50, 75, 95, 99], method="linear"))
    assert stats.PERCENTILE_METHOD == "linear"


def test_summary_matches_numpy_scipy_and_statistics():
    rng = np.random.default_rng(4)
    x = rng.normal(100.0, 7.0, 50)
    s = stats.summarize(x)
    assert s.n == 50
    assert s.median == pytest.approx(np.median(x))
    assert s.mean == pytest.approx(statistics.fmean(x))
    assert s.stdev == pytest.approx(statistics.stdev(x))
    assert s.mad == pytest.approx(sps.median_abs_deviation(x, scale=1.0))
    assert (s.min, s.max) == (x.min(), x.max())
    assert s.iqr == pytest.approx(sps.iqr(x, interpolation="linear"))
    assert s.noise_pct == pytest.approx(s.iqr / s.median * 100)


@pytest.mark.parametrize("n", [6, 7, 10, 11, 20, 31, 64, 200])
def test_median_ci_matches_scipy_quantile_test(n):
    x = np.random.default_rng(n).gamma(2.0, 3.0, n)
    lo, hi, method = stats.median_ci(x)
    ci = sps.quantile_test(x, q=float(np.median(x)), p=0.5).confidence_interval(0.95)
    assert method == "order-statistic"
    assert (lo, hi) == (ci.low, ci.high)


@pytest.mark.parametrize("n", [6, 9, 10, 25, 100])
def test_order_statistic_interval_is_the_tightest_with_95_percent_coverage(n):
    lo, hi = stats.order_statistic_indices(n)
    assert hi == n - 1 - lo

    def coverage(k: int) -> float:  # P(x(k+1) <= median <= x(n-k)) for a continuous distribution
        return 1 - 2 * sps.binom.cdf(k, n, 0.5)

    assert coverage(lo) >= 0.95
    assert coverage(lo + 1) < 0.95


def test_small_samples_fall_back_to_a_reproducible_bootstrap():
    x = [10.0, 11.0, 9.5, 10.4, 12.0]
    assert stats.order_statistic_indices(5) is None  # 2 * 0.5**5 = 6.25% > 5%: no pair is wide enough
    lo, hi, method = stats.median_ci(x)
    assert method == "bootstrap"
    assert min(x) <= lo <= np.median(x) <= hi <= max(x)
    assert stats.median_ci(x) == (lo, hi, method)


def test_degenerate_samples():
    empty = stats.summarize([])
    assert empty.n == 0 and math.isnan(empty.median) and not empty.noisy and empty.ci_method == "none"
    one = stats.summarize([4.2])
    assert (one.median, one.ci_low, one.ci_high, one.ci_method) == (4.2, 4.2, 4.2, "exact")
    assert math.isnan(one.stdev)
    same = stats.summarize([3.0] * 8)
    assert (same.ci_low, same.ci_high, same.noise_pct, same.noisy) == (3.0, 3.0, 0.0, False)


def test_non_finite_samples_are_dropped():
    s = stats.summarize([1.0, float("nan"), 2.0, 3.0, float("inf")])
    assert s.n == 3 and s.median == 2.0


def test_noise_flag_is_iqr_over_median_above_10_percent():
    # linear percentiles of [a, b, c, d, e] put p25 at b and p75 at d: IQR = d - b
    quiet = stats.summarize([90.0, 95.0, 100.0, 104.9, 110.0])  # IQR/median = 9.9%
    noisy = stats.summarize([90.0, 95.0, 100.0, 105.1, 110.0])  # 10.1%
    assert quiet.noise_pct == pytest.approx(9.9) and not quiet.noisy
    assert noisy.noise_pct == pytest.approx(10.1) and noisy.noisy


def test_ci_halfwidth_pct_is_the_larger_side():
    s = stats.summarize(list(range(1, 21)))  # median 10.5; n=20 -> x(6)..x(15) = 6..15
    assert (s.ci_low, s.ci_high) == (6.0, 15.0)
    assert s.ci_halfwidth_pct == pytest.approx(4.5 / 10.5 * 100)


def test_mann_whitney_exact_value_and_edge_cases():
    # fully separated 5 vs 5: U = 0, exact two-sided p = 2 / C(10, 5) = 2 / 252
    assert stats.mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    assert stats.mann_whitney_p([5.0] * 6, [5.0] * 6) == 1.0
    # tied small samples (e.g. peak memory, identical every repetition): exact permutation
    # p = 2 / C(6, 3) = 0.1, where the normal approximation would say 0.047 ("significant")
    assert stats.mann_whitney_p([7.0] * 3, [8.0] * 3) == pytest.approx(0.1)
    assert stats.mann_whitney_p([1.0, 1.0, 1.0], [1.0, 1.0, 2.0]) == pytest.approx(1.0)
    assert math.isnan(stats.mann_whitney_p([], [1.0, 2.0]))
    rng = np.random.default_rng(5)
    a, b = rng.normal(0, 1, 40), rng.normal(0.2, 1, 45)
    assert stats.mann_whitney_p(a, b) == pytest.approx(sps.mannwhitneyu(a, b, alternative="two-sided").pvalue)


def test_geomean():
    assert stats.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert stats.geomean([1.1, 0.9, 1.25]) == pytest.approx(sps.gmean([1.1, 0.9, 1.25]))
    assert stats.geomean([4.0, 0.0, -1.0]) == 4.0  # a ratio <= 0 has no logarithm: left out
    assert math.isnan(stats.geomean([]))


def test_summary_as_dict_states_its_methods():
    d = stats.summarize([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).as_dict()
    assert d["percentile_method"] == "linear" and d["ci_method"] == "order-statistic"
    assert set(d) >= {"median", "ci_low", "ci_high", "p5", "p95", "p99", "mad", "noisy", "ci_halfwidth_pct"}


@pytest.mark.parametrize("n, m", [(1, 1), (2, 3), (3, 3), (4, 4), (5, 5), (3, 7), (6, 6)])
def test_min_p_value_is_scipys_exact_p_at_complete_separation(n, m):
    a, b = list(range(n)), list(range(100, 100 + m))
    exact = sps.mannwhitneyu(a, b, alternative="two-sided", method="exact").pvalue
    assert stats.min_p_value(n, m) == pytest.approx(exact)
    assert stats.mann_whitney_p(a, b) == pytest.approx(exact)  # what compare reports


def test_min_p_value_of_thousands_of_samples_is_tiny_not_an_overflow():
    # full runs of fast points keep thousands of samples: C(n+m, n) no longer fits a float
    assert stats.min_p_value(2000, 2000) == 0.0 and stats.can_reach(2000, 2000, 0.05)
    assert stats.min_p_value(30, 30) == pytest.approx(2 / math.comb(60, 30), rel=1e-9)


def test_which_sample_counts_can_reach_alpha():
    assert stats.min_p_value(3, 3) == pytest.approx(0.1) and not stats.can_reach(3, 3, 0.05)
    assert stats.min_p_value(5, 5) == pytest.approx(2 / 252) and stats.can_reach(5, 5, 0.05)
    assert stats.can_reach(4, 4, 0.05) and not stats.can_reach(4, 4, 0.01)
    assert stats.min_samples_per_side(0.05) == 4 and stats.min_samples_per_side(0.01) == 5
    assert stats.min_p_value(0, 5) == 1.0


def test_quick_runs_repeat_enough_to_show_a_clear_2x_change():
    from opscope.engine.bench.measure.runner import QUICK

    n = QUICK.min_reps
    slow = [1.0 + 0.1 * i for i in range(n)]
    fast = [2.0 * v for v in slow]
    assert stats.mann_whitney_p(slow, fast) <= 0.05
    # two of the 25 pairs out of order (noise) still decide at 5+5: p = 2 * 4/252
    fast[0], slow[-1] = 1.25, 2.1  # 1.3 and 2.1 now beat 1.25
    assert stats.mann_whitney_p(slow, fast) == pytest.approx(8 / 252)
    assert stats.mann_whitney_p(slow, fast) == sps.mannwhitneyu(slow, fast, alternative="two-sided").pvalue
