"""Statistics over raw benchmark samples: summaries, confidence intervals, significance.

Methods, stated once so every report can cite them:

- Percentiles (p5/p25/p50/p75/p95/p99, IQR): numpy ``method="linear"``, i.e. Hyndman & Fan type 7
  (the numpy, R and Excel ``PERCENTILE.INC`` default).
- MAD: raw median absolute deviation, ``median(|x - median(x)|)``, not scaled to a normal sigma.
- stdev: sample standard deviation (``ddof=1``); NaN below two samples.
- 95% CI of the median: distribution-free, by order statistics: ``[x(j), x(n+1-j)]`` with ``j`` from
  the Binomial(n, 1/2) quantile (same bounds as ``scipy.stats.quantile_test``); coverage is at least
  the level asked. Below 6 samples no such pair exists at 95%, so a percentile bootstrap (fixed seed,
  reproducible) stands in, and ``ci_method`` says so.
- Noise flag: IQR / median > 10% (benchstat's and pyperf's rule of thumb for an unstable cell).
- Significance: two-sided Mann-Whitney U (``scipy.stats.mannwhitneyu``): exact for small samples
  without ties; with ties, the exact permutation distribution while there are at most 5,000
  arrangements (e.g. 3 identical peak-memory samples per run: the normal approximation would call
  3 vs 3 significant at p=0.047, the exact p is 0.1), else the normal approximation with tie
  correction. The smallest p the exact test can give n vs m samples is 2 / C(n+m, n) (every
  sample of one side below every sample of the other): 0.1 for 3+3, 0.029 for 4+4, 0.0079 for
  5+5. Where that exceeds alpha no difference can ever show as significant, and a comparison must
  say "n too small to decide", not "no significant difference" (``can_reach``).
- Geometric mean of ratios: ``scipy.stats.gmean`` over positive finite ratios.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

PERCENTILE_METHOD = "linear"  # Hyndman-Fan type 7
NOISE_THRESHOLD_PCT = 10.0
DEFAULT_CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
EXACT_PERMUTATION_LIMIT = 5000  # arrangements C(n1+n2, n1) enumerated for a tied Mann-Whitney U
BOOTSTRAP_SEED = 0x05C0BE  # fixed: the same samples always give the same interval
_PERCENTILES = (5, 25, 50, 75, 95, 99)


@dataclass(frozen=True, slots=True)
class Summary:
    n: int
    median: float
    mean: float
    stdev: float
    mad: float
    min: float
    max: float
    p5: float
    p25: float
    p50: float
    p75: float
    p95: float
    p99: float
    iqr: float
    ci_low: float
    ci_high: float
    ci_level: float
    ci_method: str  # "order-statistic" | "bootstrap" | "exact" (one sample or all equal) | "none"
    noise_pct: float  # IQR / |median| in percent
    noisy: bool

    @property
    def ci_halfwidth_pct(self) -> float:
        """Largest distance from the median to a CI bound, in % of the median (benchstat's "± x%")."""
        if self.n == 0 or self.median == 0:
            return float("nan")
        return max(self.median - self.ci_low, self.ci_high - self.median) / abs(self.median) * 100.0

    def as_dict(self) -> dict:
        return asdict(self) | {"ci_halfwidth_pct": self.ci_halfwidth_pct, "percentile_method": PERCENTILE_METHOD}


def _as_array(samples: Iterable[float]) -> np.ndarray:
    x = np.asarray(list(samples), dtype=np.float64)
    return x[np.isfinite(x)]  # a NaN sample (failed repetition) must not poison the summary


def percentiles(samples: Iterable[float], qs: Sequence[float] = _PERCENTILES) -> list[float]:
    x = _as_array(samples)
    if x.size == 0:
        return [float("nan")] * len(qs)
    return [float(v) for v in np.percentile(x, qs, method=PERCENTILE_METHOD)]


def mad(samples: Iterable[float]) -> float:
    x = _as_array(samples)
    if x.size == 0:
        return float("nan")
    return float(np.median(np.abs(x - np.median(x))))


def order_statistic_indices(n: int, confidence: float = DEFAULT_CONFIDENCE) -> tuple[int, int] | None:
    """0-based indices (lo, hi) into the sorted sample bounding the median with at least
    ``confidence`` coverage, or None when n is too small for any such pair."""
    from scipy.stats import binom

    if n < 1:
        return None
    alpha_half = (1.0 - confidence) / 2.0
    lo = int(binom.ppf(alpha_half, n, 0.5)) - 1
    if lo < 0:
        return None
    return lo, n - 1 - lo  # Binomial(n, 1/2) is symmetric, so the bounds are too


def bootstrap_median_ci(
    samples: Iterable[float],
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median; deterministic for a given seed."""
    x = _as_array(samples)
    if x.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(x, size=(resamples, x.size), replace=True), axis=1)
    alpha_half = (1.0 - confidence) / 2.0
    lo, hi = np.percentile(medians, [alpha_half * 100, (1 - alpha_half) * 100], method=PERCENTILE_METHOD)
    return float(lo), float(hi)


def median_ci(samples: Iterable[float], confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float, str]:
    """(low, high, method) for the median; see the module docstring for the methods."""
    x = np.sort(_as_array(samples))
    if x.size == 0:
        return float("nan"), float("nan"), "none"
    if x[0] == x[-1]:
        return float(x[0]), float(x[0]), "exact"
    idx = order_statistic_indices(x.size, confidence)
    if idx is None:
        lo, hi = bootstrap_median_ci(x, confidence)
        return lo, hi, "bootstrap"
    return float(x[idx[0]]), float(x[idx[1]]), "order-statistic"


def _empty_summary(confidence: float) -> Summary:
    nan = float("nan")
    return Summary(
        0, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, confidence, "none", nan, False
    )


def summarize(samples: Iterable[float], confidence: float = DEFAULT_CONFIDENCE) -> Summary:
    """Summary of raw samples (non-finite samples dropped); all-NaN with n=0 when none are left."""
    x = _as_array(samples)
    if x.size == 0:
        return _empty_summary(confidence)
    p5, p25, p50, p75, p95, p99 = percentiles(x)
    median = float(np.median(x))
    iqr = p75 - p25
    noise_pct = iqr / abs(median) * 100.0 if median != 0 else (0.0 if iqr == 0 else math.inf)
    lo, hi, method = median_ci(x, confidence)
    return Summary(
        n=int(x.size),
        median=median,
        mean=float(np.mean(x)),
        stdev=float(np.std(x, ddof=1)) if x.size > 1 else float("nan"),
        mad=mad(x),
        min=float(x.min()),
        max=float(x.max()),
        p5=p5,
        p25=p25,
        p50=p50,
        p75=p75,
        p95=p95,
        p99=p99,
        iqr=iqr,
        ci_low=lo,
        ci_high=hi,
        ci_level=confidence,
        ci_method=method,
        noise_pct=noise_pct,
        noisy=noise_pct > NOISE_THRESHOLD_PCT,
    )


def mann_whitney_p(a: Iterable[float], b: Iterable[float]) -> float:
    """Two-sided Mann-Whitney U p-value; NaN when either side is empty."""
    from scipy.stats import PermutationMethod, mannwhitneyu

    x, y = _as_array(a), _as_array(b)
    if x.size == 0 or y.size == 0:
        return float("nan")
    method: object = "auto"
    tied = np.unique(np.concatenate([x, y])).size < x.size + y.size
    if tied and math.comb(x.size + y.size, x.size) <= EXACT_PERMUTATION_LIMIT:
        method = PermutationMethod(n_resamples=np.inf)  # every arrangement: exact, ties included
    return float(mannwhitneyu(x, y, alternative="two-sided", method=method).pvalue)


def min_p_value(n: int, m: int) -> float:
    """The smallest two-sided p-value the exact Mann-Whitney U test can give n vs m samples:
    complete separation, 2 / C(n+m, n) (ties only raise it); 1 when either side is empty."""
    if n < 1 or m < 1:
        return 1.0
    # in logs: C(n+m, n) outgrows a float (10^308) by ~520+520 samples, which full runs reach
    log_comb = math.lgamma(n + m + 1) - math.lgamma(n + 1) - math.lgamma(m + 1)
    return min(1.0, 2.0 * math.exp(-log_comb))


def can_reach(n: int, m: int, alpha: float) -> bool:
    """Whether n vs m samples can show a difference as significant at ``alpha`` at all."""
    return min_p_value(n, m) <= alpha


def min_samples_per_side(alpha: float) -> int:
    """The fewest samples per side (equal sides) with which the test can reach ``alpha``:
    4 for 0.05, 5 for 0.01."""
    k = 1
    while not can_reach(k, k, alpha):
        k += 1
    return k


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of the positive finite values; NaN when none are."""
    from scipy.stats import gmean

    x = _as_array(values)
    x = x[x > 0]
    return float(gmean(x)) if x.size else float("nan")
