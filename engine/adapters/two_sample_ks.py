"""The two-sample Kolmogorov–Smirnov test, two-sided, with the standard library only.

`ks_two_sample(x, y)` gives D (the largest gap between the two empirical distribution
functions) and the p-value of D under "both samples come from one continuous
distribution": exact (lattice paths counted in integers) while n * m <= EXACT_MAX_CELLS,
else the asymptotic Kolmogorov distribution (as scipy.stats.ks_2samp's `asymp`). Ties make
the exact p-value conservative, as in scipy.

`smallest_p(n, m)` is the smallest p-value two samples of n and m can ever give (D = 1:
one sample wholly below the other, 2 of the C(n + m, n) orderings): below `alpha` only
when the samples are large enough to tell anything at that level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

EXACT_MAX_CELLS = 10_000  # n * m: the path count stays cheap (about 100 x 100) in integers


@dataclass(frozen=True)
class KsResult:
    d: float  # the KS statistic: the largest gap between the two empirical CDFs, 0..1
    p_value: float  # two-sided
    method: str  # "exact" or "asymptotic"
    n: int
    m: int


def smallest_p(n: int, m: int) -> float:
    """The smallest two-sided p-value samples of n and m values can give. Raises ValueError
    for an empty sample."""
    if n < 1 or m < 1:
        raise ValueError(f"samples of {n} and {m} values: each needs at least 1")
    return min(1.0, 2 / math.comb(n + m, n))


def ks_two_sample(x: list[float], y: list[float]) -> KsResult:
    """D and its two-sided p-value for samples `x` and `y`. Raises ValueError for an empty
    sample or a value that is not a finite number."""
    n, m = len(x), len(y)
    if n < 1 or m < 1:
        raise ValueError(f"samples of {n} and {m} values: each needs at least 1")
    for value in (*x, *y):
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"sample value {value!r} is not a finite number")
    gap = _largest_gap(sorted(x), sorted(y))  # D * n * m, an integer
    d = gap / (n * m)
    if n * m <= EXACT_MAX_CELLS:
        return KsResult(d, _exact_p(n, m, gap), "exact", n, m)
    return KsResult(d, kolmogorov_sf(d * math.sqrt(n * m / (n + m))), "asymptotic", n, m)


def _largest_gap(xs: list[float], ys: list[float]) -> int:
    """max over values t of |m * #(x <= t) - n * #(y <= t)|, ties taken together."""
    n, m = len(xs), len(ys)
    i = j = gap = 0
    while i < n or j < m:
        t = min(xs[i] if i < n else math.inf, ys[j] if j < m else math.inf)
        while i < n and xs[i] == t:
            i += 1
        while j < m and ys[j] == t:
            j += 1
        gap = max(gap, abs(i * m - j * n))
    return gap


def _exact_p(n: int, m: int, gap: int) -> float:
    """P(D * n * m >= gap): 1 - (orderings whose path stays strictly inside the band) / all."""
    if gap <= 0:
        return 1.0
    row = [1] + [0] * m  # row[j]: paths to (i, j) that stayed inside
    for j in range(1, m + 1):
        row[j] = row[j - 1] if abs(j * n) < gap else 0
    for i in range(1, n + 1):
        row[0] = row[0] if abs(i * m) < gap else 0
        for j in range(1, m + 1):
            row[j] = row[j] + row[j - 1] if abs(i * m - j * n) < gap else 0
    total = math.comb(n + m, n)
    return (total - row[m]) / total  # integers first: no cancellation for tiny p-values


def kolmogorov_sf(lam: float) -> float:
    """P(K > lam) for the Kolmogorov distribution: 2 sum_k (-1)^(k-1) exp(-2 k^2 lam^2)."""
    if lam <= 0:
        return 1.0
    if lam < 0.2:  # the series converges slowly there and the value is 1 to 15 digits
        return 1.0
    total = 0.0
    for k in range(1, 101):
        term = math.exp(-2 * k * k * lam * lam)
        total += term if k % 2 else -term
        if term < 1e-17:
            break
    return min(1.0, max(0.0, 2 * total))
