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
                  by more than any change the prompts' shared tokens show; the noise is that of
                  the divergence's pair of compute paths (paths.py), and where that pair was not
                  measured on enough tokens the prompt is unattributed, never judged on another's;
    unattributed  if there is no logprob evidence at the divergence (no logprobs and no --replay),
                  or the other token is outside the listed top logprobs and the bound on the
                  margin is within the noise (not provably numerical);
    numerical     otherwise: a near-tie the noise can flip.
The margin, not the swing, is compared: a flip happens where the noise was large, so the swing at
a flip is biased upward (on llama.cpp's Q4 server at 4 slots the swing of a true near-tie flip
came out 3% over the prefixes' largest change, while its reference margin was within it).
Run verdict: suspect > unattributed > numerical > identical (the worst prompt's).
Corruption that side B's answer shows and A's lacks (a leaked special token, a change of script:
scans.py) makes a prompt suspect whatever its margin.

Two calibrations keep a mix of prompts from fooling the rule (docs/probe.md, "Noise"):
- paths: prompts are grouped by the path the server reports it took (compare.path_of: drafted or
  plain); a path with MIN_PATH_PROMPTS measured prompts or more gets its own base, cuts and noise,
  so prompts the server drafted (verified in a multi-token batch: other kernels, other rounding)
  neither make the plain ones look like outliers nor lend them their larger noise. A smaller
  path is judged with the cuts of all prompts pooled.
- the server against itself: where side A was sent twice (--repeats >= 2, --rounds >= 2), the
  margin changes between A and A-again are what the server varies with nothing changed (cache
  state, drafting, scheduling). No prompt stands out by less than that, and the noise is at
  least its largest change. A request sent alone is never batched, so no batching bug can hide
  in this calibration.
- batches of copies: a few prompts are also sent as a batch of copies of themselves (the largest
  level's size): the server's batched kernels with nothing a batch's composition could change
  (every row the same length and tokens), so no position, padding or row-order bug acts. No
  prompt needs a level above their cuts (batch_cuts) to stand out, so a bug that moves every row
  a little (which the least-disturbed quarter would otherwise take for the noise) still shows.
Placeholder logprobs (drafted tokens) never enter: compare.py measures no change at them.
Resolution: a replay in half precision moves margins in steps of the logits' dtype; a prompt's
changes count as at least its resolution (compare.Evidence.resolution), so a one-step move is not
an outlier and the noise is at least one step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from specviz.probe import paths
from specviz.probe.compare import Evidence
from specviz.probe.scans import DECISIVE

FLOOR = 1e-5  # margin changes below this are the rounding of float32 logprobs as servers print them
MIN_DECADES = 1.0  # a prompt stands out only when its level is 10x the baseline or more
MAD_SIGMAS = 4.0
MIN_PATH_PROMPTS = 8  # a path with fewer measured prompts is judged with the pooled cuts
# A prompt stands out only on this many measured shared tokens: one token (all a speculative
# llama-server leaves with a logprob: the first) cannot tell a bug from the row a batch padded.
# Not more: a prompt a bug moves the most often diverges early (at 4, the test server's `mask`
# bug, which moves every row a little, read NUMERICAL in 2 runs of 3).
MIN_STANDOUT_TOKENS = 2
MIN_BATCH_PROMPTS = 4  # prompts sent as batches of copies needed for their cuts to count
VERDICTS = ("identical", "numerical", "unattributed", "suspect")  # worst last


@dataclass(frozen=True)
class Calibration:
    """The server against itself: side A sent again, compared with side A."""

    source: str  # what was compared, in words
    prompts: int  # prompts with a measured shared prefix
    typical: float  # the largest median margin change of a prompt
    largest: float  # the largest margin change at any shared token


@dataclass(frozen=True)
class PathNoise:
    path: str
    prompts: int
    estimate: float  # the tolerance on this path
    typical: float | None
    baseline: float | None  # 10 ** base (median levels)
    cut: float | None  # a median level above this stands out
    cut_max: float | None  # a largest change above this stands out
    pooled: bool  # too few prompts: the cuts are the pooled ones


@dataclass(frozen=True)
class Noise:
    estimate: float  # the tolerance a margin is compared with (the largest over paths)
    typical: float | None  # 10 ** median level of non-outlier prompts
    baseline: float | None  # 10 ** base
    cut: float | None  # 10 ** cut: a median level above this stands out
    cut_max: float | None  # a largest change above this stands out
    prompts: int  # prompts with a measured level
    outliers: frozenset[tuple[int, int]]  # (prompt index, round) that stand out
    paths: tuple[PathNoise, ...] = ()
    calibration: Calibration | None = None
    batch: tuple[float, float] | None = None  # batch_cuts (log10), where measured
    pairs: tuple[paths.PairNoise, ...] = ()  # per pair of compute paths (paths.py), prompts that stand out left out
    recomputable: bool = False  # the run recomputed shared prefixes (recompute.py)

    def on(self, path: str) -> PathNoise | None:
        return next((p for p in self.paths if p.path == path), None)

    def pair(self, key: str) -> paths.PairNoise | None:
        return next((p for p in self.pairs if p.pair == key), None)


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


def _at_least(x: float | None, resolution: float) -> float:
    """A change no larger than the evidence's resolution is not measured: it counts as the
    resolution (a one-step move of half-precision logits is not a perturbation)."""
    return max(x or 0.0, resolution)


def _log(x: float | None) -> float:
    return math.log10(max(x or 0.0, FLOOR))


def calibrate(evidence: Iterable[Evidence], source: str) -> Calibration | None:
    """What the server varies against itself, from comparisons of side A with side A again."""
    measured = [e for e in evidence if e.prefix_median is not None]
    if not measured:
        return None
    typical = max(max(e.prefix_median or 0.0, FLOOR) for e in measured)
    largest = max(max(e.prefix_max or 0.0, FLOOR) for e in measured)
    return Calibration(source, len(measured), typical, largest)


def _levels(e: Evidence) -> tuple[float, float]:
    return _log(_at_least(e.prefix_median, e.resolution)), _log(_at_least(e.prefix_max, e.resolution))


def batch_cuts(evidence: Iterable[Evidence]) -> tuple[float, float] | None:
    """(median cut, largest cut) from side A against batches of copies of one prompt: the
    server's batched kernels with nothing a batch's composition could change (every row the same
    length, same tokens), so no position, padding or row-order bug can act. None with fewer than
    MIN_BATCH_PROMPTS measured prompts."""
    by_prompt: dict[int, tuple[float, float]] = {}
    for e in evidence:
        if e.prefix_median is not None:
            m, x = _levels(e)
            old = by_prompt.get(e.index, (-math.inf, -math.inf))
            by_prompt[e.index] = max(old[0], m), max(old[1], x)  # a prompt's copies: its worst
    if len(by_prompt) < MIN_BATCH_PROMPTS:
        return None
    _, cut = _robust_cut([m for m, _ in by_prompt.values()])
    _, cut_max = _robust_cut([x for _, x in by_prompt.values()])
    top = max(m for m, _ in by_prompt.values()), max(x for _, x in by_prompt.values())
    return max(cut, top[0]), max(cut_max, top[1])  # never below what a copy itself showed


def estimate_noise(
    evidence: Iterable[Evidence],
    calibration: Calibration | None = None,
    batch: tuple[float, float] | None = None,
    recomputable: bool = False,
) -> Noise:
    """`batch`: batch_cuts of copies of a prompt; a prompt above them stands out even when most
    prompts are hit (a bug that moves every row a little looks like more noise otherwise).
    `recomputable`: the run recomputed shared prefixes (said in an unattributed verdict's reason)."""
    evidence = list(evidence)
    items = [e for e in evidence if e.prefix_median is not None]
    if not items:
        floor = max(FLOOR, calibration.largest) if calibration else FLOOR
        pairs = _pairs(evidence, frozenset())
        return Noise(floor, None, None, None, None, 0, frozenset(), (), calibration, None, pairs, recomputable)
    levels = {(e.index, e.round): _levels(e) for e in items}
    counted = {(e.index, e.round): e.prefix_tokens for e in items}
    pooled = _robust_cut([m for m, _ in levels.values()]), _robust_cut([x for _, x in levels.values()])
    self_m = _log(calibration.typical) if calibration else -math.inf
    self_x = _log(calibration.largest) if calibration else -math.inf
    outliers: set[tuple[int, int]] = set()
    per_path = []  # one PathNoise a path (not `paths`, the module of pairs)
    for path in sorted({e.path for e in items}):
        keys = [(e.index, e.round) for e in items if e.path == path]
        own = len(keys) >= MIN_PATH_PROMPTS
        (base, cut), (_, cut_max) = (
            (_robust_cut([levels[k][0] for k in keys]), _robust_cut([levels[k][1] for k in keys])) if own else pooled
        )
        if batch is not None:
            cut, cut_max = min(cut, batch[0]), min(cut_max, batch[1])
        out = {
            k
            for k in keys
            if counted[k] >= MIN_STANDOUT_TOKENS
            and ((levels[k][0] > max(cut, self_m)) or (levels[k][1] > max(cut_max, self_x)))
        }
        outliers |= out
        inliers = [levels[k] for k in keys if k not in out]
        estimate = max([FLOOR, calibration.largest if calibration else FLOOR] + [10**x for _, x in inliers])
        typical = 10 ** statistics.median(m for m, _ in inliers) if inliers else None
        per_path.append(PathNoise(path, len(keys), estimate, typical, 10**base, 10**cut, 10**cut_max, not own))
    inliers = [v for k, v in levels.items() if k not in outliers]
    typical = 10 ** statistics.median(m for m, _ in inliers) if inliers else None
    (base, cut), (_, cut_max) = pooled
    if batch is not None:
        cut, cut_max = min(cut, batch[0]), min(cut_max, batch[1])
    return Noise(
        max(p.estimate for p in per_path), typical, 10**base, 10**cut, 10**cut_max, len(levels),
        frozenset(outliers), tuple(per_path), calibration, batch, _pairs(evidence, frozenset(outliers)), recomputable,
    )  # fmt: skip


def _pairs(evidence: list[Evidence], outliers: frozenset[tuple[int, int]]) -> tuple[paths.PairNoise, ...]:
    """The noise per pair of paths, from the prompts that do not stand out: a prompt a bug moved
    lends no noise (recomputed prefixes are batches of copies, where no composition bug acts)."""
    kept = [e for e in evidence if (e.index, e.round) not in outliers]
    shared = [((e.index, e.round), "shared tokens", e.pairs) for e in kept if e.pairs]
    return paths.pair_noise(shared + [((e.index, e.round), "recomputed", e.recomputed) for e in kept if e.recomputed])


def decide(ev: Evidence, noise: Noise) -> tuple[str, str]:
    """(verdict, reason) for one prompt."""
    path = noise.on(ev.path)
    tolerance = path.estimate if path is not None else noise.estimate
    on = ""  # the pair of paths the tolerance was measured on, in words
    stands_out = (ev.index, ev.round) in noise.outliers
    corrupt = [detail for kind, detail in ev.findings if kind in DECISIVE]
    if corrupt:
        return "suspect", f"side B's answer shows what A's lacks: {corrupt[0]}"
    if ev.divergence is None:
        if stands_out:
            return "identical", f"same answer, but {_moved(ev, path or noise)}"
        return "identical", "same answer"
    margin, what = (ev.gap_a, "reference margin") if ev.gap_a is not None else (ev.swing, "swing")
    if ev.rescored:
        what = "reference margin (the shared prefix sent again alone: the divergent tokens were placeholders)"
    if stands_out:
        return "suspect", f"{_moved(ev, path or noise)}: this prompt stands out"
    if margin is None:
        if ev.placeholder_at_divergence:
            return "unattributed", (
                "the token at the divergence carries a placeholder, not a logprob (a drafted token): "
                "replay this prompt with --replay MODEL"
            )
        return "unattributed", "no logprobs at the divergence (ask with --logprobs, or pass --replay MODEL)"
    if ev.pair is not None:  # judged only against the noise of the paths it happened on
        measured = noise.pair(ev.pair)
        if measured is None or not measured.measured:
            placeholders = (ev.placeholders_a > 0, ev.placeholders_b > 0)
            return "unattributed", paths.unmeasured(ev.pair, measured, placeholders, noise.recomputable)
        floor = noise.calibration.largest if noise.calibration else FLOOR
        tolerance = max(measured.estimate, floor, FLOOR)
        on = f" of {paths.describe(ev.pair)} ({measured.source}, {measured.tokens} tokens)"
    if margin > tolerance:
        bound = " at least" if ev.lower_bound else ""
        return "suspect", f"{what}{bound} {margin:.3g} exceeds the noise {tolerance:.3g}{on}"
    if ev.lower_bound:
        return (
            "unattributed",
            f"the other token is outside the top logprobs; {what} >= {margin:.3g}, noise {tolerance:.3g}{on}",
        )
    return "numerical", f"{what} {margin:.3g} within the noise {tolerance:.3g}{on}"


def _moved(ev: Evidence, noise: Noise | PathNoise) -> str:
    """What made a prompt stand out: its typical shared-token change, or its largest one."""
    if ev.prefix_median is not None and noise.baseline and noise.cut and max(ev.prefix_median, FLOOR) > noise.cut:
        return f"its shared tokens moved {max(ev.prefix_median, FLOOR) / noise.baseline:.0f}x the baseline"
    if ev.prefix_max is not None:
        cut = f" (prompts stand out above {noise.cut_max:.3g})" if noise.cut_max else ""
        return f"a shared token moved {ev.prefix_max:.3g}, far beyond the other prompts' largest changes{cut}"
    return "its shared tokens moved more than the baseline"


def run_verdict(verdicts: Iterable[str]) -> str:
    return max(verdicts, key=VERDICTS.index, default="identical")
