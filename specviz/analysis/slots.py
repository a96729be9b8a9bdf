"""Slot forensics of one verify step: which physical slot held which logical token, and where the
fed state differs from what a correct left-padded engine feeds. Pure functions of a trace step.

Slots are the `cache_len` cache slots fed to the verify pass, then its `query_len` query slots
(the pending token and the k drafts), then one slot for the bonus token. Everything is
reconstructed from what the trace says was *fed* (mask_rle, position_ids, committed_before,
draft_tokens, accepted) and compared with what a correct engine feeds:

- a correct row's cache is `0^pad 1^(n-1)`: padding, then its n-1 committed tokens;
- an attended slot beyond those n-1 tokens is *extra* (stale KV, absorbed padding);
- a masked slot after the first attended one is a *hole*;
- a slot whose fed position differs from its token index is wrong (RoPE sees another place).

The trace records how many slots a row attends, not which token each physical slot holds. When a
row attends more slots than it has committed tokens, the surplus is placed in the attended slots
next to the query (where stale drafts sit right after they go stale): the count is exact, the
place is a convention, and the slot's reason says so.

Cache slots were fed in earlier steps: their fed position is the one recorded when their token
was a query slot (pending or accepted draft). Prompt tokens before the last were prefilled, which
the trace does not record, so their expected position stands in (`position_recorded` is False).

The slots' types are in `slot_model.py`; this module builds them.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from specviz.analysis.report import Report, Violation
from specviz.analysis.slot_model import ExpectedRow, RowSlots, Slot, SlotList, StepSlots
from specviz.trace.mask_runs import attended_before, mask_window
from specviz.trace.schema import RowRecord, SequenceRecord, StepRecord, Trace

# Violation fields whose evidence sits in the cache slots, or in the output (the bonus slot).
CACHE_FIELDS = ("mask_rle", "kv_len", "left_pad")
OUTPUT_FIELDS = ("write_seq", "emitted", "output_ids")

# (seq_id, token index) -> [(step index, fed position)], ordered by step index.
FedHistory = dict[tuple[int, int], list[tuple[int, int]]]


# ----------------------------------------------------------------------------- fed state


def fed_history(trace: Trace) -> FedHistory:
    """Where each token's KV was computed: the position fed when it was a kept query slot."""
    history: FedHistory = {}
    for si, step in enumerate(trace.steps):
        for row in step.rows:
            base = row.committed_before - 1
            kept = min(max(row.accepted, 0) + 1, len(row.position_ids))
            for j in range(kept):
                history.setdefault((row.seq_id, base + j), []).append((si, row.position_ids[j]))
    return history


def fed_position_before(history: FedHistory, seq_id: int, index: int, step_index: int) -> int | None:
    """The position token `index` of `seq_id` was fed at in the last step before `step_index`."""
    entries = history.get((seq_id, index))
    if not entries:
        return None
    at = bisect.bisect_left(entries, (step_index, -(10**12)))
    return entries[at - 1][1] if at > 0 else None


# Cache columns built per row: the grid shows at most 512 (its slider), the rest is never drawn.
MAX_BUILT_CACHE = 4096
MAX_STEP_CELLS = 1 << 18  # cache slots built for one step, all rows together


def expected_row(step: StepRecord, row: RowRecord) -> ExpectedRow:
    n = row.committed_before
    return ExpectedRow(
        left_pad=max(step.cache_len - (n - 1), 0),
        kv_len=n - 1,
        position_ids=list(range(n - 1, n - 1 + step.query_len)),
        write_seq=row.seq_id,
    )


# ----------------------------------------------------------------------------- slots of a row


@dataclass
class _SequenceTokens:
    """Prompt + output by index, without concatenating them for every row of every step."""

    prompt: list[int]
    output: list[int]
    # A field, not a property: read for every cache slot drawn (tens of thousands per step move).
    prompt_len: int = field(init=False)

    def __post_init__(self) -> None:
        self.prompt_len = len(self.prompt)

    def token(self, index: int) -> int | None:
        if 0 <= index < self.prompt_len:
            return self.prompt[index]
        index -= self.prompt_len
        return self.output[index] if 0 <= index < len(self.output) else None


def _cache_slots(
    step: StepRecord,
    row: RowRecord,
    lo: int,
    mask: list[int | None],
    sequence: _SequenceTokens,
    history: FedHistory,
    step_index: int,
) -> tuple[list[Slot], list[str]]:
    """Cache slots of columns lo..cache_len-1; `mask` holds the mask from column `lo` on."""
    expected_kv = max(row.committed_before - 1, 0)
    before, first_attended = attended_before(row.mask_rle, step.cache_len)
    attended = before  # attended cache slots in all, counted from the runs
    extra = max(0, attended - expected_kv)
    held = attended - extra  # attended slots that hold committed tokens
    # Token index held by the first attended slot; > 0 when the KV of old tokens is missing.
    first_index = expected_kv - held
    first_attended = step.cache_len if first_attended is None else first_attended
    # Surplus slots inside the row's declared left padding are that padding, attended (a mask not
    # passed, or pads absorbed): drawn where they are, on the left. The rest sit next to the query.
    pads = min(extra, attended_before(row.mask_rle, min(max(row.left_pad, 0), step.cache_len))[0])
    rank = attended_before(row.mask_rle, lo)[0]  # attended slots left of the window
    notes = []
    if first_index > 0:
        notes.append(f"the cache lacks the KV of {first_index} committed token(s)")
    slots = []
    for j in range(lo, step.cache_len):
        value = mask[j - lo]
        if value is None:
            slots.append(Slot(j, "empty", reasons=["the fed mask is shorter than cache + query"]))
        elif value == 0:
            slots.append(_masked_slot(j, j > first_attended))
        elif rank < pads:
            slots.append(_attended_pad_slot(j, row.left_pad))
            rank += 1
        elif rank - pads >= held:
            slots.append(_extra_slot(j, attended, expected_kv))
            rank += 1
        else:
            slots.append(_cached_token_slot(j, first_index + rank - pads, sequence, row.seq_id, history, step_index))
            rank += 1
    return slots, notes


def _masked_slot(col: int, inside: bool) -> Slot:
    if not inside:
        return Slot(col, "padding")
    return Slot(col, "hole", reasons=["masked slot inside the row (a hole after the first real slot)"])


def _extra_slot(col: int, attended: int, expected: int) -> Slot:
    return Slot(
        col,
        "extra",
        reasons=[
            f"the row attends {attended} cache slots but holds {expected} committed tokens: "
            f"{attended - expected} extra (stale KV or absorbed padding). The count is exact; which slots "
            "they are is not recorded, so they are drawn next to the query"
        ],
    )


def _attended_pad_slot(col: int, left_pad: int) -> Slot:
    return Slot(
        col,
        "extra",
        reasons=[
            f"padding attended: slot {col} is inside the row's {left_pad} padding slots, yet the mask lets the "
            "row attend it (is `attention_mask` passed?)"
        ],
    )


def _cached_token_slot(
    col: int, index: int, sequence: _SequenceTokens, seq_id: int, history: FedHistory, step_index: int
) -> Slot:
    fed = fed_position_before(history, seq_id, index, step_index)
    slot = Slot(
        col,
        "prompt" if index < sequence.prompt_len else "committed",
        token=sequence.token(index),
        token_index=index,
        fed_position=fed if fed is not None else index,
        expected_position=index,
        position_recorded=fed is not None,
    )
    if fed is not None and fed != index:
        slot.reasons.append(f"its KV was computed at position {fed}, expected {index}")
    return slot


def _query_slots(step: StepRecord, row: RowRecord, mask: list[int | None]) -> list[Slot]:
    start = row.committed_before - 1
    slots = []
    for j in range(step.query_len):
        col = step.cache_len + j
        if j == 0:
            kind, token = "pending", row.pending_token
        else:
            token = row.draft_tokens[j - 1] if j - 1 < len(row.draft_tokens) else None
            kind = "accepted" if j <= row.accepted else "rejected"
        fed = row.position_ids[j] if j < len(row.position_ids) else None
        slot = Slot(col, kind, token=token, token_index=start + j, fed_position=fed, expected_position=start + j)
        if fed is None:
            slot.reasons.append("no position ID recorded for this query slot")
        elif fed != start + j:
            slot.reasons.append(f"fed position {fed}, expected {start + j}")
        if mask[j] == 0:  # `mask` holds the query columns only
            slot.reasons.append("query slot not attended by the fed mask")
        if kind == "accepted" and j - 1 < len(row.target_tokens) and token != row.target_tokens[j - 1]:
            slot.reasons.append(f"accepted although the target predicted {row.target_tokens[j - 1]}")
        slots.append(slot)
    return slots


def _bonus_slot(step: StepRecord, row: RowRecord) -> Slot:
    col = step.cache_len + step.query_len
    if row.bonus is None:
        return Slot(col, "empty")
    index = row.committed_before + row.accepted
    return Slot(col, "bonus", token=row.bonus, token_index=index, expected_position=index)


def anchor_col(slots: list[Slot], violation: Violation, step: StepRecord) -> int:
    """The slot that shows a violation best: its own evidence if there is any, else the row's key slot."""
    query_start = step.cache_len
    bonus = step.cache_len + step.query_len
    if violation.field == "position_ids":
        candidates = [s for s in slots[query_start:bonus] if s.flagged]
    elif violation.field in CACHE_FIELDS:
        # The rightmost flagged cache slot: it is inside a window that shows the last cache slots.
        candidates = [s for s in reversed(slots[:query_start]) if s.flagged]
    elif violation.field == "accepted":
        candidates = [s for s in slots[query_start:bonus] if s.kind == "accepted" and s.flagged]
    else:
        candidates = []
    if candidates:
        return candidates[0].col
    if violation.field in OUTPUT_FIELDS:
        return bonus
    return query_start if query_start < len(slots) else max(len(slots) - 1, 0)


def _sequence_tokens(sequence: SequenceRecord | None) -> _SequenceTokens:
    if sequence is None:
        return _SequenceTokens([], [])
    return _SequenceTokens(sequence.prompt_ids, sequence.output_ids)


def row_slots(
    step: StepRecord,
    step_index: int,
    row: RowRecord,
    sequence: SequenceRecord | None,
    history: FedHistory,
    violations: list[Violation],
    first_col: int = 0,
) -> RowSlots:
    """Every slot of one row at one step (the cache from `first_col` on), violations attached.

    Columns left of `first_col` are never drawn, so never built: a row costs its window, not the
    cache width the file declares.
    """
    lo = min(max(first_col, 0), step.cache_len)
    mask = mask_window(row.mask_rle, lo, step.cache_len + step.query_len)
    cache, notes = _cache_slots(step, row, lo, mask, _sequence_tokens(sequence), history, step_index)
    slots = SlotList(lo, cache)
    slots += _query_slots(step, row, mask[step.cache_len - lo :])
    slots.append(_bonus_slot(step, row))
    anchors = []
    for violation in violations:
        col = anchor_col(slots, violation, step)
        anchors.append(col)
        anchor = slots[col]
        if violation.message not in anchor.reasons:
            anchor.reasons.append(violation.message)
    return RowSlots(
        row.row,
        row.seq_id,
        row.committed_before,
        row.accepted,
        slots,
        violations,
        notes,
        expected_row(step, row),
        row,
        anchors,
    )


def step_slots(
    trace: Trace,
    step_index: int,
    report: Report | None = None,
    history: FedHistory | None = None,
    max_cache: int = MAX_BUILT_CACHE,
    rows: Sequence[RowRecord] | None = None,
) -> StepSlots:
    """The slots of `trace.steps[step_index]`; pass `history` to reuse it across steps.

    Only the last `max_cache` cache columns are built (every one when the cache is narrower), and
    with `rows` only those rows of the step (the ones a view draws): a 1,024-row step costs its page.
    """
    if not 0 <= step_index < len(trace.steps):
        raise IndexError(f"step index {step_index} outside 0..{len(trace.steps) - 1}")
    history = history if history is not None else fed_history(trace)
    step = trace.steps[step_index]
    sequences = {s.seq_id: s for s in trace.sequences}
    here = [v for v in report.violations if v.step_index == step_index] if report else []
    # Many rows share the cells a figure can hold: a 4096-row step builds 64 cache columns a row.
    chosen = step.rows if rows is None else rows
    per_row = max(MAX_STEP_CELLS // max(len(chosen), 1), 64)
    first_col = max(step.cache_len - min(max_cache, per_row), 0)
    built = [
        row_slots(step, step_index, r, sequences.get(r.seq_id), history, [v for v in here if v.row == r.row], first_col)
        for r in chosen
    ]
    found = StepSlots(step_index, step, built, None)
    first = report.first_violation if report else None
    if first is not None and first.step_index == step_index:
        first_row = found.find_row(first.row)
        if first_row is not None:
            found.first_violation = (first.row, _first_anchor(first_row, first, step))
    return found


def _first_anchor(row: RowSlots, first: Violation, step: StepRecord) -> int:
    """Where the run's first violation was placed in its row (the "desync begins here" cell)."""
    for violation, col in zip(row.violations, row.anchors):
        if violation is first or violation == first:
            return col
    return anchor_col(row.slots, first, step)  # not among the row's (a hand-built report)
