"""Distribution tests for sampling engines that are exact in distribution, not token for token.

Speculative rejection sampling emits tokens distributed exactly as sampling from the target, but
no single run can be compared token by token with anything. What can be checked is the law: fix a
context, collect many emitted tokens from independent keys, and test their frequencies against
the target's probabilities with Pearson's chi-square. scipy is not a dependency, so the chi-square
survival function (the regularized upper incomplete gamma function) is computed here.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MIN_EXPECTED = 5.0  # Pearson's rule of thumb: pool categories expected fewer times than this
_EPS = 1e-15
_MAX_ITER = 10_000


@dataclass(frozen=True)
class ChiSquare:
    statistic: float
    dof: int
    p_value: float
    samples: int
    bins: int  # categories after pooling the rare ones

    def passes(self, alpha: float = 1e-3) -> bool:
        """No evidence at level `alpha` that the samples come from another distribution."""
        return self.p_value >= alpha


def _lower_series(a: float, x: float) -> float:
    """Regularized lower gamma P(a, x) by its power series (converges fast for x < a + 1)."""
    term = total = 1.0 / a
    denom = a
    for _ in range(_MAX_ITER):
        denom += 1.0
        term *= x / denom
        total += term
        if abs(term) < abs(total) * _EPS:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _upper_fraction(a: float, x: float) -> float:
    """Regularized upper gamma Q(a, x) by Lentz's continued fraction (for x >= a + 1)."""
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, _MAX_ITER):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def regularized_upper_gamma(a: float, x: float) -> float:
    """Q(a, x) = Gamma(a, x) / Gamma(a), for a > 0 and x >= 0."""
    if a <= 0:
        raise ValueError(f"a must be positive, got {a}")
    if x <= 0:
        return 1.0
    if x < a + 1.0:
        return max(0.0, 1.0 - _lower_series(a, x))
    return min(1.0, _upper_fraction(a, x))


def chi_square_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square with `dof` degrees of freedom."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {dof}")
    return regularized_upper_gamma(dof / 2.0, statistic / 2.0)


def chi_square_test(samples: Iterable[int], probs: Sequence[float], min_expected: float = MIN_EXPECTED) -> ChiSquare:
    """Pearson's goodness-of-fit test of `samples` (category ids) against `probs` (per category).

    Categories expected fewer than `min_expected` times are pooled into one bin (the
    approximation needs expected counts of about 5). A sample in a zero-probability category
    makes the statistic infinite and the p-value 0: the sampler produced the impossible.
    """
    counts = Counter(samples)
    n = sum(counts.values())
    if n == 0:
        raise ValueError("no samples")
    total = float(sum(probs))
    if total <= 0:
        raise ValueError("probabilities sum to zero")
    impossible = sum(c for cat, c in counts.items() if not 0 <= cat < len(probs) or probs[cat] <= 0)
    if impossible:
        return ChiSquare(math.inf, max(1, len(probs) - 1), 0.0, n, len(probs))
    observed: list[float] = []
    expected: list[float] = []
    pooled_obs = pooled_exp = 0.0
    for cat, p in enumerate(probs):
        exp = n * p / total
        if exp <= 0:
            continue
        if exp < min_expected:
            pooled_obs += counts.get(cat, 0)
            pooled_exp += exp
        else:
            observed.append(counts.get(cat, 0))
            expected.append(exp)
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    dof = max(1, len(expected) - 1)
    return ChiSquare(statistic, dof, chi_square_sf(statistic, dof), n, len(expected))
