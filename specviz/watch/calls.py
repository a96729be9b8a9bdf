"""Reading one row of one captured call: its query (from the mask, padding on either side), its
pending slot and draft chain (`RowQuery`), the argmax at a slot, and the mask row it was fed.

`steps.py` builds the trace's steps from these readings; see its docstring for the rules. Every
reading is of a materialized call (`CallRecord.materialize`: lists, flags and last slots set).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

from specviz.watch.hooks import CallRecord


@dataclass(frozen=True)
class RowQuery:
    """One row of one target call as read: where its pending token sits, and its d drafts."""

    pending: int  # query slot of the pending token
    drafts: int  # d: draft tokens after it
    chain: tuple[tuple[int, int], ...]  # (draft call index, draft row) per draft, in order


def row_seq_ids(call: CallRecord) -> tuple[int, ...]:
    """The sequence each row of the call held (the default order when the engine declared none)."""
    if call.rows is not None and len(call.rows) == call.batch_size:
        return call.rows
    return tuple(range(call.batch_size))


# ----------------------------------------------------------------------------- one row of a call


def query_flags(call: CallRecord, row: int) -> list[int]:
    """1 for each query slot of `row` that is attended (a real token), 0 for padding."""
    return call.query_flags(row)


def last_slot(call: CallRecord, row: int) -> int:
    """The row's last attended query slot (the last column unless the row is right-padded)."""
    return call.last_slots[row]


def argmax_at(call: CallRecord, row: int, slot: int) -> int | None:
    """The model's argmax at query slot `slot` of `row`, if its logits were kept."""
    if call.argmax is None:
        return None
    kept = call.argmax[row]
    index = slot - (call.query_len - len(kept))
    return kept[index] if 0 <= index < len(kept) else None


def context_before(call: CallRecord, row: int, slot: int) -> int:
    """Slots the query token at `slot` attends before itself (-1: a mask the hooks could not read)."""
    if call.mask_kind == "none":
        return call.cache_width + slot
    if call.mask_kind == "2d":
        values = call.mask[row]
        return int(sum(values[: len(values) - call.query_len + slot]))
    if call.mask_kind == "4d" and slot == call.query_len - 1:  # the kept tail ends with the last query row
        return int(sum(call.mask[row][-1][: call.cache_width + slot]))
    return -1


def _draft_row(call: CallRecord, seq: int, row: int, batch_size: int, fed: int, out: int) -> int | None:
    """The row of draft call `call` that was fed `fed` and proposed `out` for sequence `seq` (in row
    `row` of a target batch of `batch_size`): the declared row, else the same index in a batch of
    the same size, else (a draft batch of other rows) the first row whose tokens fit."""
    if call.argmax is None:
        return None

    def fits(r: int) -> bool:
        last = last_slot(call, r)
        return call.input_ids[r][last] == fed and argmax_at(call, r, last) == out

    if call.rows is not None and len(call.rows) == call.batch_size:
        if seq not in call.rows:
            return None
        r = call.rows.index(seq)
        return r if fits(r) else None
    if call.batch_size == batch_size:  # the same rows, undeclared: the same index
        return row if fits(row) else None
    return next((r for r in range(call.batch_size) if fits(r)), None)


def read_row(calls: list[CallRecord], index: int, row: int, pass_reprefill: bool = True) -> RowQuery:
    """The row's pending slot and proposal chain in target call `index` (see the module docstring).

    The chain is the longest run of consecutive draft calls (of this row, since the sequence's
    previous target call) that fed the query's slots p .. p+d-1 and proposed p+1 .. p+d, with p the
    last attended slot minus d; of equal runs, the earliest (a draft that repeats itself proposes
    the same token at several calls: the engine used the first ones).
    """
    verify = calls[index]
    ids = verify.input_ids[row]
    seq = row_seq_ids(verify)[row]
    last = last_slot(verify, row)
    flags = query_flags(verify, row)
    proposals = _draft_calls(calls, index, seq, pass_reprefill)
    for d in range(min(len(proposals), last), 0, -1):
        p = last - d
        if not all(flags[p : last + 1]):
            continue
        for start in range(len(proposals) - d + 1):
            chain = []
            for i in range(d):
                hit = _draft_row(calls[proposals[start + i]], seq, row, verify.batch_size, ids[p + i], ids[p + 1 + i])
                if hit is None:
                    break
                chain.append((proposals[start + i], hit))
            if len(chain) == d:
                return RowQuery(p, d, tuple(chain))
    return RowQuery(last, 0, ())


def _draft_calls(calls: list[CallRecord], index: int, seq: int, pass_reprefill: bool) -> list[int]:
    """Draft calls since the sequence's previous target call, in order. A target call of this
    sequence with no draft call after it and no drafts in its own query (a re-prefill between the
    proposals and the verify) is passed over, once."""
    found: list[int] = []
    passed = not pass_reprefill
    for j in range(index - 1, -1, -1):
        call = calls[j]
        if call.role != "target":
            if call.argmax is not None:
                found.append(j)
            continue
        if seq in row_seq_ids(call):
            if found or passed or read_row(calls, j, row_seq_ids(call).index(seq), False).drafts:
                break
            passed = True
    return found[::-1]


class CallReader:
    """`read_row` for every (call, row), computed once."""

    def __init__(self, calls: list[CallRecord]) -> None:
        self.calls = calls
        self._rows: dict[tuple[int, int], RowQuery] = {}

    def __call__(self, index: int, row: int) -> RowQuery:
        key = (index, row)
        if key not in self._rows:
            self._rows[key] = read_row(self.calls, index, row)
        return self._rows[key]


# ----------------------------------------------------------------------------- masks


def mask_row(call: CallRecord, row: int, rq: RowQuery) -> tuple[list[list[int]], int, bool | None]:
    """(mask_rle, attended context slots of the pending token, query block causal or None).

    The row's mask covers its context (every slot before the pending one, cached or re-fed) and
    its own d + 1 query slots; padding after its last real token is not part of it.
    """
    context_len = call.cache_width + rq.pending
    q = rq.drafts + 1
    if call.mask_kind == "none":
        return [[1, context_len + q]], context_len, None
    if call.mask_kind == "2d":
        values = call.mask[row]
        start = len(values) - call.query_len + rq.pending  # the pending slot's column
        return _rle(values[: start + q]), int(sum(values[:start])), None
    if call.mask_kind == "4d":
        return _mask4_row(call.mask[row], call.cache_width, call.query_len, rq)
    return [], -1, None


def _mask4_row(block: list[list[bool]], width: int, q: int, rq: RowQuery) -> tuple[list[list[int]], int, bool | None]:
    """The pending query's view of the context, then the diagonal; causal if every later query
    slot of the row sees that same context plus exactly the query slots up to itself."""
    slot, n = rq.pending, rq.drafts + 1
    first = len(block) - (q - slot)  # index of the pending slot's row inside the kept tail
    if first < 0:
        return [], -1, None
    context_len = width + slot
    view = [int(v) for v in block[first][:context_len]]
    diagonal = [int(block[first + i][context_len + i]) for i in range(n)]
    causal = True
    for i in range(n):
        line = block[first + i]
        if [int(v) for v in line[:context_len]] != view:
            causal = False
        query_part = [int(v) for v in line[context_len : context_len + n]]
        if query_part[: i + 1] != [1] * (i + 1) or any(query_part[i + 1 :]):
            causal = False
    return _rle(view + diagonal), sum(view), causal


def _rle(values: list[int]) -> list[list[int]]:
    """[0, 0, 1, 1, 1] -> [[0, 2], [1, 3]], canonical like the recorder's."""
    return [[int(value), len(list(run))] for value, run in groupby(values)]
