"""The row checks of one Parquet row group, a column at a time, for the rows they all pass.

`check_step` and `FinishChecks.check_step` walk rows in Python (tens of microseconds a row-step).
Here a row group's columns become NumPy arrays and every condition a correct row meets is evaluated
for all rows at once; each row's history before it (committed length, pending token, finished or
not) is the sequence's state before the group plus what its earlier rows in the group wrote. The
steps before the group's first step with a row that any check would flag, or that these arrays
cannot judge (a row writing to another sequence, a sequence twice in one step), are then applied
to the checker's state in bulk: exactly what the row-by-row walk does to a clean row (advance the
history, note skipped checks and recorded fields), with nothing to report. The caller walks the
rest of the group row by row, so every violation, its message and its order come from the one
implementation in `row_checks`, `recorded` and `finish`. Rows before the first flagged one see
exact histories (they depend only on earlier clean rows), so that first flag is exact too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specviz.analysis.arrays import Columns, sums
from specviz.analysis.findings import Findings
from specviz.analysis.finish import NO_ROW_FINISH, FinishChecks
from specviz.analysis.history import History
from specviz.analysis.recorded import DRAFT_UNMATCHED
from specviz.analysis.row_checks import NO_MASK, NO_TARGETS, NOT_LEFT_PADDED

EOS_LENGTH, BUDGET_LENGTH = len("eos"), len("length")  # finish_reason told apart by its length


@dataclass
class Before:
    """Each row's sequence as the row-by-row walk would see it before the row's step, `[rows]`."""

    seqs: np.ndarray  # [unique] seq ids of the group, sorted
    which: np.ndarray  # [rows] index into `seqs`
    written: np.ndarray  # tokens written before the row
    last_token: np.ndarray
    finished: np.ndarray  # finished before the row (a row of a finished sequence is flagged)
    prompt_len: np.ndarray
    budget: np.ndarray  # the sequence's own max_new_tokens (`History`: the run's, or its own)
    last_emitted: np.ndarray  # the row's own last emitted token (-1: emitted nothing)
    done: np.ndarray  # the row finishes its sequence (EOS last, or the budget reached)
    eos_any: np.ndarray  # the row emitted an EOS
    eos_inside: np.ndarray  # ... with tokens after it


def check_clean_steps(
    columns: Columns, first: int, findings: Findings, history: History, finish: FinishChecks
) -> tuple[int, int]:
    """Apply the slice's leading steps that pass every check; returns (steps applied, steps in the slice)."""
    step_numbers = columns.step
    new_step = np.ones(len(step_numbers), dtype=bool)
    new_step[1:] = step_numbers[1:] != step_numbers[:-1]
    total = int(np.count_nonzero(new_step))
    if not total:
        return 0, 0
    local = np.cumsum(new_step) - 1  # [rows] step of each row inside the group
    before = _before(columns, history)
    bad = _row_flags(columns, before, history, finish.records_finish)
    bad_steps = set(local[bad].tolist()) | _step_flags(columns, before, local, history.left_padded)
    clean = min(bad_steps, default=total)
    if clean:
        rows = int(np.flatnonzero(new_step)[clean]) if clean < total else columns.n
        _apply(columns, before, rows, first + local, findings, history, finish)
        history.step_numbers.extend(step_numbers[new_step][:clean].tolist())
    return clean, total


def _before(c: Columns, history: History) -> Before:
    """Per row, the state of its sequence before it: the group's start plus its earlier rows."""
    seqs, which = np.unique(c.seq_id, return_inverse=True)
    states = [history.seqs[s] for s in seqs.tolist()]
    written0 = np.array([s.written for s in states], dtype=np.int64)
    last0 = np.array([s.last_token for s in states], dtype=np.int64)
    finished0 = np.array([s.finished_at is not None for s in states], dtype=bool)
    prompt_len = np.array([s.prompt_len for s in states], dtype=np.int64)
    budget = np.array([s.budget for s in states], dtype=np.int64)[which]
    e = c.emitted.lengths
    last_emitted = np.where(e > 0, c.emitted.at(np.arange(c.n), e - 1), -1)
    order = np.argsort(which, kind="stable")  # each sequence's rows together, in trace order
    g, e_o = which[order], e[order]
    seg_start = np.ones(c.n, dtype=bool)
    seg_start[1:] = g[1:] != g[:-1]
    seg_first = np.maximum.accumulate(np.where(seg_start, np.arange(c.n), 0))  # [rows] first row of its segment
    before_sum = np.cumsum(e_o) - e_o
    written = np.empty(c.n, dtype=np.int64)
    written[order] = written0[g] + before_sum - before_sum[seg_first]
    wrote_at = np.maximum.accumulate(np.where(e_o > 0, np.arange(c.n), -1))  # last row so far that wrote
    previous = np.concatenate([[-1], wrote_at[:-1]])
    from_group = previous >= seg_first
    last = np.empty(c.n, dtype=np.int64)
    last[order] = np.where(from_group, last_emitted[order][np.maximum(previous, 0)], last0[g])
    eos_any, eos_inside = _eos_inside(c, np.array(sorted(history.eos), dtype=np.int64))
    done = (eos_any & ~eos_inside) | (written + e >= budget)  # EOS last, or the sequence's budget
    finished = np.empty(c.n, dtype=bool)  # a row after its sequence's done row is "decoded again"
    finished[order] = finished0[g] | (np.concatenate([[False], done[order][:-1]]) & ~seg_start)
    return Before(
        seqs, which, written, last, finished, prompt_len[which], budget, last_emitted, done, eos_any, eos_inside
    )


def _row_flags(c: Columns, b: Before, history: History, records_finish: bool) -> np.ndarray:
    """[rows]: the row may be flagged by some check (or is beyond what these arrays judge)."""
    n1 = c.committed_before - 1
    bad = (c.write_seq != c.seq_id) | b.finished
    bad |= (c.committed_before != b.prompt_len + b.written) | (c.pending_token != b.last_token)
    bad |= _accounting_flags(c, b, history)
    bad |= ~_positions_ok(c, n1) | _kv_flags(c, n1, history) | _recorded_flags(c, n1)
    bad |= _mask_flags(c, history) | b.eos_inside
    if records_finish:
        bad |= _reason_flags(c, b)
    return bad


def _accounting_flags(c: Columns, b: Before, history: History) -> np.ndarray:
    """Draft count, accepted in range and equal to the agreeing prefix, emitted a prefix of what
    verification allows (cut by the budget and EOS), the bonus field (row_checks.check_accounting)."""
    k, rows = history.k, np.arange(c.n)
    d, t, e, acc = c.draft_tokens.lengths, c.target_tokens.lengths, c.emitted.lengths, c.accepted
    bad = (d > k) | ((d < k) & history.declared_layout) | (acc < 0) | (acc > np.minimum(d, k))
    greedy = t == d + 1
    drafts = c.draft_tokens
    j = drafts.index
    agree = (j < t[drafts.row_of]) & (drafts.values == c.target_tokens.at(drafts.row_of, j))
    agreeing = np.bincount(drafts.row_of[agree & (j < acc[drafts.row_of])], minlength=c.n)
    next_agrees = np.zeros(c.n, dtype=bool)
    short = np.flatnonzero((acc < d) & (acc >= 0))
    next_agrees[short] = agree[drafts.start[short] + acc[short]]
    bad |= greedy & ((agreeing != acc) | next_agrees)
    emitted = c.emitted
    je, acc_e = emitted.index, acc[emitted.row_of]
    proposal = np.where(
        je < acc_e, drafts.at(emitted.row_of, je), c.target_tokens.at(emitted.row_of, acc_e)
    )  # items past acc + 1 fail the length test below
    allowed = np.minimum(acc + 1, np.maximum(0, b.budget - b.written))
    bad |= greedy & ((e > allowed) | ~emitted.all(emitted.values == proposal))
    # sampled (no targets): the accepted drafts, then at most one free token (_check_sampled_shape)
    drafted = emitted.all((je >= acc_e) | (emitted.values == drafts.at(emitted.row_of, je)))
    bad |= ~greedy & ((e > acc + 1) | ~drafted)
    has_bonus = e == acc + 1
    bonus = emitted.at(rows, acc)
    bad |= np.where(has_bonus, ~c.bonus_valid | (c.bonus != bonus), c.bonus_valid)
    return bad


def _positions_ok(c: Columns, n1: np.ndarray) -> np.ndarray:
    """position_ids == n-1 .. n-1+d, d+1 of them (or the step's query_len if shorter)."""
    fed = c.position_ids
    query = np.minimum(c.draft_tokens.lengths + 1, c.query_len)
    return (fed.lengths == query) & fed.all(fed.values == n1[fed.row_of] + fed.index)


def _kv_flags(c: Columns, n1: np.ndarray, history: History) -> np.ndarray:
    draft_first = ~c.draft_kv_lens_valid & c.draft_kv_len_valid & (history.k > 0) & (c.draft_kv_len != n1)
    return (c.kv_len != n1) | draft_first


def _recorded_flags(c: Columns, n1: np.ndarray) -> np.ndarray:
    """The optional state fields (recorded.check_recorded_row)."""
    bad = (c.query_causal_valid & ~c.query_causal) | c.kv_mismatch_slot_valid
    for lists in (c.draft_position_ids, c.draft_kv_lens):
        bad |= ~lists.all(lists.values == n1[lists.row_of] + lists.index)
    inputs = getattr(c, "draft_input_tokens", None)  # schema 4 (_check_draft_inputs)
    if inputs is not None:
        row_of, j = inputs.row_of, inputs.index
        own = np.where(j == 0, c.pending_token[row_of], c.draft_tokens.at(row_of, j - 1))
        bad |= ~inputs.all((inputs.values == own) & (j <= c.draft_tokens.lengths[row_of]))
    return bad


def _mask_flags(c: Columns, history: History) -> np.ndarray:
    """Alignment (left-padded layout) and the mask counts (row_checks.check_alignment, check_kv)."""
    kinds, counts, n = c.run_kinds.values, c.run_counts, c.n
    row_of, sizes = counts.row_of, counts.values
    first = counts.start[row_of]  # [runs] the first run of each run's row
    positive = sizes > 0
    seen = np.cumsum(positive)
    rank = seen - (seen[first] - positive[first])  # [runs] 1 for the row's first attended-or-padding run
    bad = np.zeros(n, dtype=bool)
    if history.left_padded:
        holes = np.bincount(row_of[positive & (kinds == 0) & (rank > 1)], minlength=n) > 0
        lead = sums(row_of, np.where(positive & (rank == 1) & (kinds == 0), sizes, 0), n)
        bad |= holes | (c.left_pad != lead)
    query = np.minimum(c.draft_tokens.lengths + 1, c.query_len)
    if history.declared_layout:
        cache_len, wrong_width = c.cache_len, c.width != c.cache_len + c.query_len
    else:
        cache_len, wrong_width = c.width - query, np.zeros(n, dtype=bool)
    begin = np.cumsum(sizes) - sizes
    begin = begin - begin[first]  # [runs] slot where the run starts inside its row
    in_cache = np.clip(np.minimum(begin + sizes, cache_len[row_of]) - begin, 0, None)
    attended = kinds == 1
    cache = sums(row_of, np.where(attended, in_cache, 0), n)
    query_attended = sums(row_of, np.where(attended, sizes, 0), n) - cache
    query_bad = query_attended != query if history.declared_layout else query_attended < query
    bad |= wrong_width | (cache != c.kv_len) | query_bad
    return bad & c.has_runs


def _eos_inside(c: Columns, eos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: (an EOS among the emitted tokens, an EOS before the last emitted token)."""
    emitted = c.emitted
    is_eos = np.isin(emitted.values, eos)
    inside = is_eos & (emitted.index < emitted.lengths[emitted.row_of] - 1)
    any_eos = np.bincount(emitted.row_of[is_eos], minlength=c.n) > 0
    return any_eos, np.bincount(emitted.row_of[inside], minlength=c.n) > 0


def _reason_flags(c: Columns, b: Before) -> np.ndarray:
    """`finished` / `finish_reason` against what the row gave its sequence (finish.check_row_reason)."""
    e = c.emitted.lengths
    by_eos = (e > 0) & b.eos_any
    by_budget = (e > 0) & (b.written + e >= b.budget)
    reason = c.reason > 0
    bad = (c.finished != reason) | (reason != (by_eos | by_budget))
    return bad | ((c.reason == EOS_LENGTH) & ~by_eos) | ((c.reason == BUDGET_LENGTH) & ~by_budget)


def _step_flags(c: Columns, b: Before, local: np.ndarray, left_padded: bool) -> set[int]:
    """Steps with one sequence in two rows, or (left-padded) mask rows of different widths."""
    keys = np.sort(local * len(b.seqs) + b.which)
    bad = set((keys[1:][keys[1:] == keys[:-1]] // len(b.seqs)).tolist())
    masked = c.run_counts.lengths > 0  # an empty mask_rle has no width to compare
    if left_padded and masked.any():
        steps, widths = local[masked], c.width[masked]
        starts = np.flatnonzero(np.concatenate([[True], steps[1:] != steps[:-1]]))
        differ = np.minimum.reduceat(widths, starts) != np.maximum.reduceat(widths, starts)
        bad |= set(steps[starts][differ].tolist())
    return bad


# ----------------------------------------------------------------------------- applying clean steps


def _apply(
    c: Columns, b: Before, rows: int, si: np.ndarray, findings: Findings, history: History, finish: FinishChecks
) -> None:
    """What the row walk does with clean rows [0, rows): skipped-check notes, recorded fields, histories."""
    si, cut = si[:rows], slice(0, rows)
    d, t = c.draft_tokens.lengths[cut], c.target_tokens.lengths[cut]
    has_runs = c.has_runs[cut]
    findings.skip_steps(*NO_MASK, si[~has_runs])
    if not history.left_padded:
        findings.skip_steps(*NOT_LEFT_PADDED, si[has_runs])
    findings.skip_steps(*NO_TARGETS, si[t != d + 1])
    unmatched = (d > 0) & ~c.draft_kv_lens_valid[cut] & ~c.draft_kv_len_valid[cut]
    findings.skip_steps(*DRAFT_UNMATCHED, si[unmatched])
    if not finish.records_finish:
        findings.skip(*NO_ROW_FINISH)
    recorded = {
        "query_causal": c.query_causal_valid[cut].any(),
        "draft_position_ids": c.draft_position_ids_valid[cut].any(),
        "draft_kv_lens": c.draft_kv_lens_valid[cut].any(),
        "draft_input_tokens": c.draft_input_tokens_valid[cut].any(),
        "kv_content_checked": (c.kv_content_checked[cut] | c.kv_mismatch_slot_valid[cut]).any(),
    }
    findings.recorded.update(name for name, seen in recorded.items() if seen)
    _advance(c, b, rows, si, history, finish)


def _advance(c: Columns, b: Before, rows: int, si: np.ndarray, history: History, finish: FinishChecks) -> None:
    """Each sequence's history after the clean rows: written, pending token, finished, last seen."""
    which = b.which[:rows]
    e = c.emitted.lengths[:rows]
    written = b.written[:rows] + e
    for u, row in _last_rows(which, np.ones(rows, dtype=bool)):
        finish.last_seen[int(b.seqs[u])] = int(si[row])
    for u, row in _last_rows(which, e > 0):
        state = history.seqs[int(b.seqs[u])]
        state.last_token = int(b.last_emitted[row])
        if state.watched:  # a registered token may be among these writes: replay them in order
            for r in np.flatnonzero((which == u) & (e > 0)).tolist():
                state.wrote(int(si[r]), int(written[r]))
        else:
            state.wrote(int(si[row]), int(written[row]))
    for u, row in _last_rows(which[::-1], b.done[:rows][::-1]):  # reversed: the first done row
        state = history.seqs[int(b.seqs[u])]
        if state.finished_at is None:
            state.finished_at = int(si[rows - 1 - row])


def _last_rows(which: np.ndarray, mask: np.ndarray) -> list[tuple[int, int]]:
    """(sequence index, its last row where `mask`) for each sequence with such a row."""
    rows = np.flatnonzero(mask)
    if not len(rows):
        return []
    uniq, pos = np.unique(which[rows][::-1], return_index=True)
    return list(zip(uniq.tolist(), rows[::-1][pos].tolist()))
