"""Acceptance, exactness and throughput metrics: pure functions of a trace (definitions in docs/forensics.md#metrics).

Definitions match vLLM and llama.cpp:
- acceptance rate = accepted draft tokens / drafted tokens
- mean acceptance length = 1 + accepted / verify steps (one verify step = one row in one step)
- per-position acceptance[i] = verify steps that accepted at least i+1 drafts / verify steps
- acceptance given the previous depth[i] = verify steps that accepted at least i+1 drafts / those
  that accepted at least i (i = 0: all verify steps): the chance draft i+1 survives once draft i did
- acceptance histogram[j] = verify steps that accepted exactly j drafts
- exact match = share of prompts whose emitted token IDs equal the reference's
- throughput = emitted tokens / decoding wall time
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specviz.analysis.acceptance import Acceptance
from specviz.analysis.arrays import Columns, Lists, step_slices
from specviz.analysis.budgets import sequence_budgets
from specviz.analysis.exactness import exact_match, sequence_divergence
from specviz.trace.arrow import numbers
from specviz.trace.schema import Trace


def acceptance(trace: Trace) -> tuple[Acceptance, dict[int, Acceptance]]:
    """Totals, and per sequence (token-averaged totals hide short prompts)."""
    totals = step_totals(trace)
    return totals.acceptance, totals.per_seq


@dataclass
class StepTotals:
    """Everything the metrics sum over the steps, gathered in one pass (a Parquet trace's steps
    are read from disk as they are walked: one walk, not one per metric)."""

    acceptance: Acceptance = field(default_factory=Acceptance)
    per_seq: dict[int, Acceptance] = field(default_factory=dict)
    steps: int = 0
    left_on_table: int = 0  # tokens verification allowed that the engine did not emit
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    align_ms: float = 0.0
    total_ms: float = 0.0
    # `add_columns`' per-sequence sums not yet in `per_seq`: a walk ends with `settle` (both walks do).
    pending: SequenceSums | None = field(default=None, repr=False, compare=False)


# Per-sequence histograms as one [sequences, k + 1] array up to this many cells (32 MB); a file
# declaring a larger k or more sequences sums per slice into `per_seq` directly.
MAX_DENSE_CELLS = 1 << 22


@dataclass
class SequenceSums:
    """Per-sequence acceptance sums of the slices `add_columns` saw, as arrays over the run's
    sequences (`TotalsRules.seq_ids`): a slice adds a few `bincount`s, not a Python call per
    sequence (tens of thousands of them over a million row-steps). `settle` moves them into
    `StepTotals.per_seq` in order of first appearance, the order `setdefault` gives row by row."""

    seq_ids: np.ndarray  # [sequences] sorted
    k: int
    verifies: np.ndarray  # [sequences]
    drafted: np.ndarray
    accepted: np.ndarray
    histogram: np.ndarray  # [sequences, k + 1]
    seen: np.ndarray  # [sequences] bool
    order: list[np.ndarray] = field(default_factory=list)  # sequence indices, first appearance first

    @classmethod
    def of(cls, rules: TotalsRules) -> SequenceSums | None:
        n, k = len(rules.seq_ids), rules.k
        if n * (k + 1) > MAX_DENSE_CELLS:
            return None
        zeros = functools.partial(np.zeros, n, dtype=np.int64)
        return cls(rules.seq_ids, k, zeros(), zeros(), zeros(), np.zeros((n, k + 1), np.int64), np.zeros(n, bool))

    def add(self, which: np.ndarray, drafted: np.ndarray, accepted: np.ndarray, bins: np.ndarray) -> None:
        """One slice's verifies: `which` the sequence index of each (all known), in row order."""
        n = len(self.seq_ids)
        self.verifies += np.bincount(which, minlength=n)
        self.drafted += np.bincount(which, weights=drafted, minlength=n).astype(np.int64)
        self.accepted += np.bincount(which, weights=accepted, minlength=n).astype(np.int64)
        np.add.at(self.histogram, (which, bins), 1)
        uniq, first_at = np.unique(which, return_index=True)
        new = ~self.seen[uniq]
        self.order.append(uniq[new][np.argsort(first_at[new], kind="stable")])
        self.seen[uniq] = True


def settle(totals: StepTotals) -> None:
    """Move the pending per-sequence sums of `add_columns` into `per_seq` (before a row's own sums)."""
    sums, totals.pending = totals.pending, None
    if sums is None:
        return
    order = np.concatenate([*sums.order, np.zeros(0, dtype=np.int64)]).tolist()
    ids, verifies = sums.seq_ids.tolist(), sums.verifies.tolist()
    drafted, accepted, histogram = sums.drafted.tolist(), sums.accepted.tolist(), sums.histogram.tolist()
    for u in order:
        target = totals.per_seq.setdefault(ids[u], Acceptance())
        _add_counts(target, sums.k, verifies[u], drafted[u], accepted[u], histogram[u])


@dataclass
class TotalsRules:
    """What the sums need from the header and the sequences, looked up once per walk."""

    k: int
    max_new: int  # the run's budget: a row of a sequence the trace does not list
    eos: frozenset[int]
    prompt_len: dict[int, int]
    budget: dict[int, int]  # each sequence's own max_new_tokens (`budgets.sequence_budgets`)
    seq_ids: np.ndarray  # [sequences] sorted
    prompt_lens: np.ndarray  # [sequences] prompt length of each of `seq_ids`
    budgets: np.ndarray  # [sequences] budget of each of `seq_ids`

    @classmethod
    def of(cls, trace: Trace) -> TotalsRules:
        prompt_len = {s.seq_id: len(s.prompt_ids) for s in trace.sequences}
        seq_ids = sorted(prompt_len)
        h = trace.header
        budget = sequence_budgets(h, seq_ids)
        return cls(
            h.draft_k,
            h.max_new_tokens,
            frozenset(h.eos_token_ids),
            prompt_len,
            budget,
            np.array(seq_ids, dtype=np.int64),
            np.array([prompt_len[s] for s in seq_ids], dtype=np.int64),
            np.array([budget[s] for s in seq_ids], dtype=np.int64),
        )

    def left_on_row(self, row: Any) -> int:
        """`_left_on_row` with the row's sequence's own budget."""
        return _left_on_row(row, self.budget.get(row.seq_id, self.max_new), self.prompt_len, self.eos)


def step_totals(trace: Trace) -> StepTotals:
    """The sums of every metric in one walk (`check_trace` gathers them in its own walk: `Report.totals`)."""
    rules = TotalsRules.of(trace)
    totals = StepTotals()
    groups = getattr(trace.steps, "column_groups", None)  # a Parquet trace: a row group at a time
    if groups is None:
        for step in trace.steps:
            add_step(totals, step, rules)
        return totals
    for _, table, decode in groups():
        for offset, part in step_slices(table):
            columns = Columns.of(part)
            if columns is None:  # a shape the arrays do not take: the rest of the group row by row
                for step in decode()[offset:]:
                    add_step(totals, step, rules)
                break
            add_columns(totals, part, columns, rules)
    settle(totals)
    return totals


def totals_of(trace: Trace, totals: StepTotals | None) -> StepTotals:
    """`totals` when a walk already gathered them (the check's `Report.totals`), else one walk."""
    return totals if totals is not None else step_totals(trace)


def add_step(totals: StepTotals, step: Any, rules: TotalsRules) -> None:
    settle(totals)  # the slices before this step enter `per_seq` first
    k = rules.k
    totals.steps += 1
    totals.draft_ms += step.draft_ms
    totals.verify_ms += step.verify_ms
    totals.align_ms += step.align_ms
    totals.total_ms += step.total_ms
    for row in step.rows:
        totals.left_on_table += rules.left_on_row(row)
        drafted = min(len(row.draft_tokens), k)  # d: ragged where the engine drafts fewer
        if k == 0 or not drafted:
            continue  # nothing proposed: not a verify of drafts
        totals.acceptance.add(row.accepted, k, drafted)
        totals.per_seq.setdefault(row.seq_id, Acceptance()).add(row.accepted, k, drafted)


def add_columns(totals: StepTotals, table: Any, c: Columns, rules: TotalsRules) -> None:
    """`add_step` over a slice of a row group's columns: the same sums, in the same order where it
    matters (timings are added step by step, sequences enter `per_seq` in order of first appearance)."""
    k = rules.k
    first = np.ones(c.n, dtype=bool)
    first[1:] = c.step[1:] != c.step[:-1]  # each step's first row carries its timings
    totals.steps += int(np.count_nonzero(first))
    for name in ("draft_ms", "verify_ms", "align_ms", "total_ms"):
        value = getattr(totals, name)
        for ms in numbers(table.column(name))[first].tolist():
            value += ms
        setattr(totals, name, value)
    totals.left_on_table += _left_on_columns(c, rules)
    drafted = np.minimum(c.draft_tokens.lengths, k)
    verified = np.flatnonzero(drafted > 0) if k else np.zeros(0, dtype=np.int64)
    if not len(verified):
        return
    seq_ids, accepted, drafted = c.seq_id[verified], c.accepted[verified], drafted[verified]
    bins = np.minimum(accepted, k)
    _add_counts(
        totals.acceptance, k, len(accepted), int(drafted.sum()), int(accepted.sum()), np.bincount(bins).tolist()
    )
    known = rules.seq_ids
    at = np.clip(np.searchsorted(known, seq_ids), 0, max(len(known) - 1, 0))
    if len(known) and (known[at] == seq_ids).all():
        totals.pending = totals.pending or SequenceSums.of(rules)
        if totals.pending is not None:
            totals.pending.add(at, drafted, accepted, bins)
            return
    settle(totals)  # a sequence the footer lacks, or too many cells: this slice's sums go in directly
    uniq, first_at, which = np.unique(seq_ids, return_index=True, return_inverse=True)
    verifies = np.bincount(which, minlength=len(uniq)).tolist()
    drafted_sums = np.bincount(which, weights=drafted, minlength=len(uniq)).astype(np.int64).tolist()
    accepted_sums = np.bincount(which, weights=accepted, minlength=len(uniq)).astype(np.int64).tolist()
    # Per sequence, the (accepted, verifies) pairs that occur: no [sequences, k + 1] array (k is the file's).
    pairs, counts = np.unique(which * (k + 1) + bins, return_counts=True)
    histograms: dict[int, list[int]] = {}
    for pair, count in zip(pairs.tolist(), counts.tolist()):
        u, j = divmod(pair, k + 1)
        histogram = histograms.setdefault(u, [0] * (j + 1))
        histogram.extend([0] * (j + 1 - len(histogram)))
        histogram[j] = count
    for u in np.argsort(first_at, kind="stable").tolist():  # first appearance order, as setdefault
        target = totals.per_seq.setdefault(int(uniq[u]), Acceptance())
        _add_counts(target, k, verifies[u], drafted_sums[u], accepted_sums[u], histograms[u])


def _add_counts(target: Acceptance, k: int, verifies: int, drafted: int, accepted: int, histogram: list[int]) -> None:
    """`Acceptance.add` for `verifies` verifies of these totals (`histogram[j]`: verifies accepting j)."""
    if len(target.histogram) < k + 1:
        target.histogram.extend([0] * (k + 1 - len(target.histogram)))
    target.verify_steps += verifies
    target.drafted += drafted
    target.accepted += accepted
    for j, count in enumerate(histogram):
        if count:
            target.histogram[j] += count


def _left_on_columns(c: Columns, rules: TotalsRules) -> int:
    """`_left_on_row` summed over a row group: a row that emitted at least what verification allows
    leaves nothing (most rows); the others are computed row by row."""
    d, t, e, acc = c.draft_tokens.lengths, c.target_tokens.lengths, c.emitted.lengths, c.accepted
    known = rules.seq_ids
    at = np.clip(np.searchsorted(known, c.seq_id), 0, max(len(known) - 1, 0))
    listed = known[at] == c.seq_id if len(known) else np.zeros(c.n, dtype=bool)
    starts = np.where(listed, rules.prompt_lens[at], 0) if len(known) else np.zeros(c.n, dtype=np.int64)
    budgets = np.where(listed, rules.budgets[at], rules.max_new) if len(known) else np.full(c.n, rules.max_new)
    allowed = np.minimum(np.minimum(acc, d) + 1, np.maximum(0, budgets - (c.committed_before - starts)))
    left = 0
    for r in np.flatnonzero((t > acc) & (e < allowed)).tolist():
        row = types.SimpleNamespace(
            accepted=int(acc[r]),
            committed_before=int(c.committed_before[r]),
            seq_id=int(c.seq_id[r]),
            **{name: _items(getattr(c, name), r) for name in ("draft_tokens", "target_tokens", "emitted")},
        )
        left += rules.left_on_row(row)
    return left


def _items(lists: Lists, r: int) -> list[int]:
    return lists.values[lists.start[r] : lists.start[r] + lists.lengths[r]].tolist()


def tokens_emitted(trace: Trace) -> int:
    return sum(len(s.output_ids) for s in trace.sequences)


def tokens_per_second(trace: Trace) -> float | None:
    seconds = trace.header.decode_seconds
    return tokens_emitted(trace) / seconds if seconds else None


def tokens_left_on_table(trace: Trace, totals: StepTotals | None = None) -> float | None:
    """Tokens per step that verification allowed but the engine did not emit (no bonus, say).

    Speed lost, not exactness: a row that emits a prefix of what it could have emitted is correct.
    Allowed = the accepted drafts plus the bonus, cut at the sequence's remaining budget and
    after its first EOS. Rows whose target tokens are not recorded are left out.
    """
    totals = totals_of(trace, totals)
    return totals.left_on_table / totals.steps if totals.steps else None


def _left_on_row(row: Any, max_new: int, prompt_len: dict[int, int], eos: frozenset[int]) -> int:
    """What the row could have emitted and did not; `max_new`: its sequence's own budget."""
    if len(row.target_tokens) <= row.accepted:
        return 0
    allowed = row.draft_tokens[: row.accepted] + [row.target_tokens[row.accepted]]
    budget = max_new - (row.committed_before - prompt_len.get(row.seq_id, 0))
    allowed = allowed[: max(0, budget)]
    cut = next((i + 1 for i, t in enumerate(allowed) if t in eos), len(allowed))
    if row.emitted == allowed[: len(row.emitted)]:
        return max(0, cut - len(row.emitted))
    return 0


def phase_times(trace: Trace, totals: StepTotals | None = None) -> dict[str, float]:
    """Milliseconds summed over steps: draft, verify, align, and the rest (bookkeeping)."""
    t = totals_of(trace, totals)
    return {
        "draft_ms": t.draft_ms,
        "verify_ms": t.verify_ms,
        "align_ms": t.align_ms,
        "bookkeeping_ms": max(0.0, t.total_ms - t.draft_ms - t.verify_ms - t.align_ms),
        "total_ms": t.total_ms,
    }


def summary(trace: Trace, totals: StepTotals | None = None) -> dict[str, Any]:
    """The record command's summary: one flat JSON-able dict (`totals`: a walk already made)."""
    totals = totals_of(trace, totals)
    total = totals.acceptance
    h = trace.header
    return {
        "method": h.method,
        "fault": h.fault,
        "num_prompts": len(trace.sequences),
        "batch_size": trace.batch_rows,  # the effective batch: never more rows than prompts
        "draft_k": h.draft_k,
        "max_new_tokens": h.max_new_tokens,
        "complete": h.complete,
        "exact_match": exact_match(trace),
        "acceptance_rate": total.rate,
        "mean_acceptance_length": total.mean_length,
        "per_position_acceptance": total.per_position,
        "per_position_acceptance_given_previous": total.per_position_given_previous,
        "tokens_emitted": tokens_emitted(trace),
        "decode_seconds": h.decode_seconds,
        "tokens_per_second": tokens_per_second(trace),
        "steps": totals.steps,
        "tokens_left_on_table_per_step": tokens_left_on_table(trace, totals),
        "exspec_group_share": h.options.get("group_share"),
        "first_divergence": [sequence_divergence(s, h.complete) for s in trace.sequences],
        **phase_times(trace, totals),
    }
