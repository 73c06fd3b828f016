"""The two-sample KS test (engine/adapters/two_sample_ks.py) against known values: the
exact p-value against a brute-force count of every ordering and the Gnedenko–Korolyuk
formula for equal samples, the Kolmogorov distribution's tabled values, and the smallest
attainable p-value."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from engine.adapters.two_sample_ks import kolmogorov_sf, ks_two_sample, smallest_p


def brute_force_p(n: int, m: int, d_gap: int) -> float:
    """P(D * n * m >= d_gap) over all C(n + m, n) orderings, each equally likely."""
    hits = total = 0
    for xs in itertools.combinations(range(n + m), n):
        chosen, i, j, gap = set(xs), 0, 0, 0
        for k in range(n + m):
            i, j = (i + 1, j) if k in chosen else (i, j + 1)
            gap = max(gap, abs(i * m - j * n))
        hits += gap >= d_gap
        total += 1
    return hits / total


def test_known_statistic_and_exact_p():
    result = ks_two_sample([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert result.d == 1.0 and result.method == "exact"
    assert result.p_value == pytest.approx(2 / 252, rel=1e-12)  # 2 of C(10, 5) orderings
    same = ks_two_sample([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])
    assert same.d == pytest.approx(1 / 3) and same.p_value == 1.0
    # scipy.stats.ks_2samp's documented shape: D is the largest CDF gap, here 3 of 4 at x = 3
    assert ks_two_sample([1, 2, 3, 10], [4, 5, 6, 7]).d == pytest.approx(0.75)


@pytest.mark.parametrize("n, m", [(2, 3), (3, 3), (3, 5), (4, 4), (4, 6), (5, 7)])
def test_exact_p_matches_every_ordering_counted(n, m):
    rng = random.Random(n * 100 + m)
    for _ in range(6):
        x = [rng.random() for _ in range(n)]
        y = [rng.random() for _ in range(m)]
        result = ks_two_sample(x, y)
        assert result.p_value == pytest.approx(brute_force_p(n, m, round(result.d * n * m)), abs=1e-12)


@pytest.mark.parametrize("n", [4, 8, 12])
def test_equal_samples_match_the_gnedenko_korolyuk_formula(n):
    """P(D >= k/n) = 2 sum_{j>=1} (-1)^(j-1) C(2n, n - jk) / C(2n, n)."""
    from engine.adapters.two_sample_ks import _exact_p

    for k in range(1, n + 1):
        formula = 2 * sum((-1) ** (j - 1) * math.comb(2 * n, n - j * k) for j in range(1, n // k + 1))
        assert _exact_p(n, n, k * n) == pytest.approx(min(1.0, formula / math.comb(2 * n, n)), abs=1e-12)


def test_the_kolmogorov_distribution_and_the_asymptotic_path():
    assert kolmogorov_sf(1.0) == pytest.approx(0.2699996716773546, rel=1e-9)
    assert kolmogorov_sf(1.3581) == pytest.approx(0.05, abs=1e-4)  # the tabled 5% point
    assert kolmogorov_sf(1.6276) == pytest.approx(0.01, abs=1e-4)  # the tabled 1% point
    assert kolmogorov_sf(0.0) == 1.0 and kolmogorov_sf(5.0) < 1e-20
    rng = random.Random(7)
    far = ks_two_sample([rng.gauss(0, 1) for _ in range(150)], [rng.gauss(1, 1) for _ in range(150)])
    assert far.method == "asymptotic" and far.p_value < 1e-6 and far.d > 0.3
    near = ks_two_sample([rng.gauss(0, 1) for _ in range(150)], [rng.gauss(0, 1) for _ in range(150)])
    assert near.p_value > 0.01


def test_the_smallest_p_value_says_when_samples_are_too_small():
    assert smallest_p(3, 3) == pytest.approx(0.1)  # 2 of 20: never below 0.05
    assert smallest_p(4, 4) == pytest.approx(2 / 70)
    assert smallest_p(2, 4) == pytest.approx(2 / 15) and smallest_p(3, 6) == pytest.approx(2 / 84)
    assert ks_two_sample([1, 2, 3], [4, 5, 6]).p_value == pytest.approx(smallest_p(3, 3))


def test_bad_samples_are_refused_naming_them():
    with pytest.raises(ValueError, match="samples of 0 and 2 values"):
        ks_two_sample([], [1, 2])
    with pytest.raises(ValueError, match="sample value nan is not a finite number"):
        ks_two_sample([1.0, float("nan")], [1.0])
