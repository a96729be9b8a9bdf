"""Acceptance per draft position, and its collapse under concurrency.

A draft round proposes up to k tokens; the target keeps the leading ones it agrees with. Position
i of a round is *accepted* when the first i + 1 draft tokens all were (acceptance is a prefix, so
a token after a rejected one is never accepted). Servers count it two ways:

- vLLM's Prometheus counter `vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`,
  beside `vllm:spec_decode_num_drafts_total` (rounds): accepted[i] directly;
- SGLang's `meta_info.spec_accept_histogram` per request: H[n] = verify rounds that accepted
  exactly n draft tokens, so accepted[i] = sum of H[n] for n > i and rounds = sum of H.

From (rounds, accepted[0..k-1]):
    rate(i)        = accepted[i] / rounds                 (vLLM's own "acceptance per position")
    conditional(i) = accepted[i] / accepted[i-1]          (position i given i - 1; position 0: rate)
each with a 95% Wilson interval over its trials (rounds, or the rounds accepted through i - 1).
A drafter that proposes fewer than k tokens in some rounds (n-gram finds no match that long) has
its undrafted positions counted as rejected: the counters do not say which rounds were shorter.

A **collapse at position i** under concurrency: level N's conditional acceptance at i is clearly
below level 1's (the 95% intervals apart, and a drop of at least `telemetry.COLLAPSE_DROP`). The
conditional rate isolates the depth that broke: a bug that corrupts only the draft's later
positions (wrong positions or KV for the second draft step of a batched row) leaves position 0
alone and shows at 1 and after, where the overall rate may move too little to say so. Intervals
apart need enough rounds at that depth on both sides: a few drafts never make a finding.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from specviz.probe import report as rp
from specviz.probe import telemetry


def of(rows: Iterable[telemetry.Drafting]) -> tuple[rp.PositionRate, ...]:
    """Per-position acceptance over requests or passes that counted it (`Drafting.positions`)."""
    rows = [d for d in rows if d.positions is not None and d.drafts]
    if not rows:
        return ()
    total = functools.reduce(telemetry.add, rows)
    return rates(total.drafts or 0, total.positions or ())


def rates(rounds: int, accepted: Sequence[int]) -> tuple[rp.PositionRate, ...]:
    """Per position: acceptance over the rounds and conditional on the position before, with
    95% Wilson intervals. Nothing when there were no rounds."""
    if rounds <= 0:
        return ()
    out = []
    for i, a in enumerate(accepted):
        given = rounds if i == 0 else accepted[i - 1]
        low, high = telemetry.wilson(a, rounds)
        c_low, c_high = telemetry.wilson(a, given) if given else (None, None)
        conditional = a / given if given else None
        out.append(rp.PositionRate(i, a, a / rounds, low, high, given, conditional, c_low, c_high))
    return tuple(out)


def collapse(level1: rp.Acceptance | None, level: rp.Acceptance | None) -> rp.PositionRate | None:
    """The first draft position whose conditional acceptance at `level` is clearly below level
    1's (intervals apart, a drop of COLLAPSE_DROP); None where none is, or either side's
    telemetry was unreadable (it decides nothing)."""
    if level1 is None or level is None or level1.unreadable or level.unreadable:
        return None
    for a, b in zip(level1.positions, level.positions):
        if None in (a.conditional, b.conditional, a.conditional_low, b.conditional_high):
            continue
        apart = b.conditional_high < a.conditional_low  # type: ignore[operator]
        if apart and a.conditional - b.conditional >= telemetry.COLLAPSE_DROP:  # type: ignore[operator]
            return b
    return None


def rate_collapsed(level1: rp.Acceptance, level: rp.Acceptance) -> bool:
    """The overall rate's collapse (telemetry.collapsed), on the report's numbers."""
    if None in (level1.rate, level.rate, level1.low, level.high):
        return False
    return level.high < level1.low and level1.rate - level.rate >= telemetry.COLLAPSE_DROP  # type: ignore[operator]


def describe(level1: rp.Acceptance, position: rp.PositionRate, concurrency: int) -> str:
    """'acceptance at draft position 1 given position 0: 0.81 [0.75, 0.86] at concurrency 1, ...'."""
    a = level1.positions[position.position]
    given = "" if position.position == 0 else f" given position {position.position - 1}"
    return (
        f"acceptance at draft position {position.position}{given}: {a.conditional:.2f} "
        f"[{a.conditional_low:.2f}, {a.conditional_high:.2f}] of {a.given} at concurrency 1, "
        f"{position.conditional:.2f} [{position.conditional_low:.2f}, {position.conditional_high:.2f}] "
        f"of {position.given} at concurrency {concurrency}"
    )


def line(positions: Sequence[rp.PositionRate]) -> str:
    """'pos 0 0.68 [0.61, 0.74], pos 1 0.55 | 0.81 given 0, ...' for the text output."""
    parts = []
    for p in positions:
        given = "" if p.position == 0 or p.conditional is None else f" ({p.conditional:.2f} given {p.position - 1})"
        parts.append(f"pos {p.position} {p.rate:.2f} [{p.low:.2f}, {p.high:.2f}]{given}")
    return ", ".join(parts)


def shown(report: rp.ProbeReport) -> list[tuple[str, rp.Acceptance]]:
    """(name, acceptance) of each side or level that counted acceptance per draft position: side
    A, then each level above 1 of a sweep (or side B)."""
    named = [(f"side A ({report.side_a.label})", report.side_a.acceptance)]
    if report.levels:
        named += [(f"concurrency {v.concurrency}", v.acceptance) for v in report.levels if v.concurrency > 1]
    else:
        named.append((f"side B ({report.side_b.label})", report.side_b.acceptance))
    return [(name, a) for name, a in named if a is not None and a.positions]
