"""Independent oracles for sampling tests: plain Python, no import from `specviz` (docs/testing.md).

What a sample *should* be, written again from the definitions rather than from the engine's code:
softmax of logits / T in Python floats, top-k and top-p by sorting a Python list, the keyed noise
hash (lowbias32 over (seed, stream, seq_id, index, vocab entry), docs in `engine/sampling.py`) in
Python integers, and Pearson's chi-square with critical values from a table (scipy is not a
dependency). A bug in the engine's tempering, filtering, noise or rejection rule cannot hide here
by being shared with the oracle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

M32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9

# chi2.ppf(1 - 1e-4, dof) (scipy.stats, computed once): a correct sampler exceeds it with
# probability 1e-4, and the tests use fixed keys, so they are deterministic anyway.
CHI2_CRITICAL_1E4 = {
    1: 15.14, 2: 18.42, 3: 21.11, 4: 23.51, 5: 25.74, 6: 27.86, 7: 29.88, 8: 31.83, 9: 33.72, 10: 35.56,
    11: 37.37, 12: 39.13, 13: 40.87, 14: 42.58, 15: 44.26, 16: 45.92, 17: 47.57, 18: 49.19, 19: 50.80,
    20: 52.39, 24: 58.61, 29: 66.15, 31: 69.11, 39: 80.65,
}  # fmt: skip


# --- the keyed noise, from its definition --------------------------------------------------------


def mix32(x: int) -> int:
    """lowbias32 (Chris Wellons' 32-bit finaliser)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def absorb(state: int, value: int) -> int:
    return mix32(((state + GOLDEN) & M32) ^ (value & M32))


def key_bits(seed: int, stream: int, seq_id: int, index: int, entry: int | None = None) -> int:
    state = absorb(absorb(absorb(mix32(seed & M32), stream), seq_id), index)
    return state if entry is None else absorb(state, entry)


def key_uniform(seed: int, stream: int, seq_id: int, index: int, entry: int | None = None) -> float:
    """The top 23 bits plus half a step: uniform on (0, 1), never 0 or 1."""
    return ((key_bits(seed, stream, seq_id, index, entry) >> 9) + 0.5) / float(1 << 23)


def key_gumbel(seed: int, stream: int, seq_id: int, index: int, entry: int) -> float:
    return -math.log(-math.log(key_uniform(seed, stream, seq_id, index, entry)))


# --- distributions, from their definitions -------------------------------------------------------


def softmax(logits: Sequence[float], temperature: float = 1.0) -> list[float]:
    scaled = [x / temperature for x in logits]
    top = max(scaled)
    exps = [math.exp(x - top) if x != -math.inf else 0.0 for x in scaled]
    total = sum(exps)
    return [e / total for e in exps]


def keep_top_k(probs: Sequence[float], k: int) -> set[int]:
    """Indices kept by top-k: every entry at least as likely as the k-th most likely (ties kept)."""
    if k <= 0 or k >= len(probs):
        return set(range(len(probs)))
    kth = sorted(probs, reverse=True)[k - 1]
    return {i for i, p in enumerate(probs) if p >= kth}


def keep_top_p(probs: Sequence[float], top_p: float) -> set[int]:
    """Smallest most-likely-first prefix whose mass reaches top_p (the boundary token is kept)."""
    if top_p >= 1.0:
        return {i for i, p in enumerate(probs) if p > 0}
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, mass = set(), 0.0
    for i in order:
        if mass >= top_p:
            break
        kept.add(i)
        mass += probs[i]
    return kept


def target_distribution(logits: Sequence[float], temperature: float, top_k: int = 0, top_p: float = 1.0) -> list[float]:
    """What one token is sampled from: softmax(logits / T), top-k, then top-p, renormalised."""
    probs = softmax(logits, temperature)
    kept = keep_top_k(probs, top_k)
    after_k = [p if i in kept else 0.0 for i, p in enumerate(probs)]
    total = sum(after_k)
    after_k = [p / total for p in after_k]
    kept = keep_top_p(after_k, top_p)
    final = [p if i in kept else 0.0 for i, p in enumerate(after_k)]
    total = sum(final)
    return [p / total for p in final]


def residual(p: Sequence[float], q: Sequence[float]) -> list[float]:
    """norm(max(0, p - q)): where rejection sampling draws after a rejected draft."""
    r = [max(0.0, a - b) for a, b in zip(p, q)]
    total = sum(r)
    return [x / total for x in r]


# --- Pearson's chi-square ------------------------------------------------------------------------


def chi_square(counts: Sequence[int], probs: Sequence[float]) -> tuple[float, int]:
    """(statistic, degrees of freedom) of observed `counts` against `probs`.

    Categories with probability 0 must never be observed (asserted); the rest enter the statistic.
    Expected counts should be >= 5: the tests pick sizes so they are.
    """
    n = sum(counts)
    stat, bins = 0.0, 0
    for c, p in zip(counts, probs, strict=True):
        if p == 0.0:
            assert c == 0, f"a category of probability 0 was observed {c} times"
            continue
        expected = n * p
        stat += (c - expected) ** 2 / expected
        bins += 1
    return stat, bins - 1


def assert_chi_square(counts: Sequence[int], probs: Sequence[float], what: str = "") -> float:
    stat, dof = chi_square(counts, probs)
    if dof == 0:
        return 0.0
    critical = CHI2_CRITICAL_1E4[dof]
    n = sum(counts)
    observed = [round(c / n, 4) for c in counts]
    expected = [round(p, 4) for p in probs]
    assert stat < critical, f"{what}: chi2 {stat:.1f} >= {critical} (dof {dof}); got {observed}, want {expected}"
    return stat
