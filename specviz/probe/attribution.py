"""Numerical or suspect: the noise between the two sides, estimated from the data, and the rule.

The noise is measured where both sides still agree (every prompt's shared prefix, see
compare.py): each prompt has a level, the median margin change over its shared tokens. A bug
perturbs the requests it hits (padded rows, certain slots, positions) far more than those it
spares, and it may hit most of them (every row but the longest of each batch), so the baseline is
taken from the least-disturbed quarter, on a log scale (noise spans 1e-6 to 1e-1 between
servers):

    L_i      = log10(max(level_i, FLOOR))              over prompts with >= 1 measured shared token
    base     = lower quartile of L
    spread   = 1.4826 * median(|L_i - base| for L_i <= median(L))      (a MAD of the lower half)
    cut      = base + max(MIN_DECADES, MAD_SIGMAS * spread)
    the same for X_i = log10(max(largest margin change_i, FLOOR)), giving cut_X
    outlier  = L_i > cut or X_i > cut_X                    (the prompt "stands out")
    noise    = max(FLOOR, largest margin change at any shared token of a non-outlier prompt)
The median level catches a prompt perturbed throughout; the largest change one perturbed at a
few positions; both are judged against the least-disturbed quarter of the prompts, so the noise
is bounded by what the spared prompts show even when most prompts are hit.

Per diverged prompt, with margin = gap_A, the reference's (side A's) logprob of its own token
minus that of side B's token at the divergent position (its top-1 minus top-2 margin when B's
token is A's second choice; compare.py), or the swing gap_A + gap_B where A has no logprobs there:
    suspect       if the prompt stands out, or margin > noise: the reference preferred its token
                  by more than any change the prompts' shared tokens show;
    unattributed  if there is no logprob evidence at the divergence (no logprobs and no --replay),
                  or the other token is outside the listed top logprobs and the bound on the
                  margin is within the noise (not provably numerical);
    numerical     otherwise: a near-tie the noise can flip.
The margin, not the swing, is compared: a flip happens where the noise was large, so the swing at
a flip is biased upward (on llama.cpp's Q4 server at 4 slots the swing of a true near-tie flip
came out 3% over the prefixes' largest change, while its reference margin was within it).
Run verdict: suspect > unattributed > numerical > identical (the worst prompt's).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from specviz.probe.compare import Evidence

FLOOR = 1e-5  # margin changes below this are the rounding of float32 logprobs as servers print them
MIN_DECADES = 1.0  # a prompt stands out only when its level is 10x the baseline or more
MAD_SIGMAS = 4.0
VERDICTS = ("identical", "numerical", "unattributed", "suspect")  # worst last


@dataclass(frozen=True)
class Noise:
    estimate: float  # the tolerance a swing is compared with
    typical: float | None  # 10 ** median level of non-outlier prompts
    baseline: float | None  # 10 ** base
    cut: float | None  # 10 ** cut: a level above this stands out
    prompts: int  # prompts with a measured level
    outliers: frozenset[int]  # prompt indices that stand out


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of a sorted, non-empty list."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _robust_cut(logs: list[float]) -> tuple[float, float]:
    """(base, cut) of log levels: the lower quartile, and the level above which one stands out."""
    logs = sorted(logs)
    base = _quantile(logs, 0.25)
    middle = _quantile(logs, 0.5)
    spread = 1.4826 * statistics.median(abs(x - base) for x in logs if x <= middle)
    return base, base + max(MIN_DECADES, MAD_SIGMAS * spread)


def estimate_noise(evidence: Iterable[Evidence]) -> Noise:
    levels = {
        e.index: (math.log10(max(e.prefix_median, FLOOR)), math.log10(max(e.prefix_max or 0.0, FLOOR)))
        for e in evidence
        if e.prefix_median is not None
    }
    if not levels:
        return Noise(FLOOR, None, None, None, 0, frozenset())
    base, cut = _robust_cut([m for m, _ in levels.values()])
    _, cut_max = _robust_cut([x for _, x in levels.values()])
    outliers = frozenset(i for i, (m, x) in levels.items() if m > cut or x > cut_max)
    inliers = [v for i, v in levels.items() if i not in outliers]
    estimate = max([FLOOR] + [10**x for _, x in inliers])
    typical = 10 ** statistics.median(m for m, _ in inliers) if inliers else None
    return Noise(estimate, typical, 10**base, 10**cut, len(levels), outliers)


def decide(ev: Evidence, noise: Noise) -> tuple[str, str]:
    """(verdict, reason) for one prompt."""
    if ev.divergence is None:
        if ev.index in noise.outliers:
            return "identical", f"same answer, but {_moved(ev, noise)}"
        return "identical", "same answer"
    margin, what = (ev.gap_a, "reference margin") if ev.gap_a is not None else (ev.swing, "swing")
    if ev.index in noise.outliers:
        return "suspect", f"{_moved(ev, noise)}: this prompt stands out"
    if margin is None:
        return "unattributed", "no logprobs at the divergence (ask with --logprobs, or pass --replay MODEL)"
    if margin > noise.estimate:
        bound = " at least" if ev.lower_bound else ""
        return "suspect", f"{what}{bound} {margin:.3g} exceeds the noise {noise.estimate:.3g}"
    if ev.lower_bound:
        return (
            "unattributed",
            f"the other token is outside the top logprobs; {what} >= {margin:.3g}, noise {noise.estimate:.3g}",
        )
    return "numerical", f"{what} {margin:.3g} within the noise {noise.estimate:.3g}"


def _moved(ev: Evidence, noise: Noise) -> str:
    """What made a prompt stand out: its typical shared-token change, or its largest one."""
    if ev.prefix_median is not None and noise.baseline and noise.cut and max(ev.prefix_median, FLOOR) > noise.cut:
        return f"its shared tokens moved {max(ev.prefix_median, FLOOR) / noise.baseline:.0f}x the baseline"
    if ev.prefix_max is not None:
        return f"a shared token moved {ev.prefix_max:.3g}, far beyond the other prompts' largest changes"
    return "its shared tokens moved more than the baseline"


def run_verdict(verdicts: Iterable[str]) -> str:
    return max(verdicts, key=VERDICTS.index, default="identical")
