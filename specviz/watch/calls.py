"""Reading one row of one captured call: its query (from the mask, padding on either side), its
pending slot and draft chain (`RowQuery`), the argmax at a slot, and the mask row it was fed.

`steps.py` builds the trace's steps from these readings; see its docstring for the rules. Every
reading is of a materialized call (`CallRecord.materialize`: lists, flags and last slots set).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from specviz.watch.map import Segment
from specviz.watch.record import CallRecord


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


_UNSAID = Segment(None, 0, 0, 1)  # what a call with no readable map says of a row: nothing


def segment_of(call: CallRecord, row: int) -> Segment:
    """The segment of the call's map that the row holds: what a producer said of it (`drafts`: the
    drafts that end its query, None: not said; `chunk`: a prefill chunk that yields no token, no
    step of its sequence); one that says nothing where the call has no readable map."""
    segments = call.map.segments if call.map is not None else ()
    return segments[row] if len(segments) == call.batch_size else _UNSAID


def tree_of(call: CallRecord, row: int) -> list[int] | None:
    """The parents of the tree the row verifies (`tree.read_trees`); None for a chain row."""
    return call.trees[row] if call.trees else None


# ----------------------------------------------------------------------------- one row of a call


def query_flags(call: CallRecord, row: int) -> list[int]:
    """1 for each query slot of `row` that is attended (a real token), 0 for padding."""
    return call.query_flags(row)


def last_slot(call: CallRecord, row: int) -> int:
    """The row's last attended query slot (the last column unless the row is right-padded)."""
    return call.last_slots[row]


def argmax_at(call: CallRecord, row: int, slot: int) -> int | None:
    """The model's argmax at query slot `slot` of `row`, if its logits were kept."""
    if call.argmax is None or not call.argmax_is_choice:
        return None
    kept = call.argmax[row]
    index = slot - (call.query_len - len(kept))
    return kept[index] if 0 <= index < len(kept) else None


def context_before(call: CallRecord, row: int, slot: int) -> int:
    """Slots the query token at `slot` attends before itself (-1: a mask the hooks could not read)."""
    return call.view(row).before(slot)


def _draft_row(call: CallRecord, seq: int, row: int, batch_size: int, fed: int, out: int) -> int | None:
    """The row of draft call `call` that was fed `fed` and proposed `out` for sequence `seq` (in row
    `row` of a target batch of `batch_size`): the declared row, else the same index in a batch of
    the same size, else (a draft batch of other rows) the first row whose tokens fit. `call` is
    one of `_draft_calls`: its argmax was kept."""

    def fits(r: int) -> bool:
        last = last_slot(call, r)
        return call.input_ids[r][last] == fed and (not call.argmax_is_choice or argmax_at(call, r, last) == out)

    rows: Iterable[int] = range(call.batch_size)
    if call.rows is not None:  # declared (the batch map keeps a draft call's rows only at its size)
        rows = [call.rows.index(seq)] if seq in call.rows else []
    elif call.batch_size == batch_size and fits(row):  # the same rows, undeclared: the same index
        return row
    # Else another order (a packed draft call packs its rows its own way) or other rows: the row
    # whose tokens fit, when one does (several in a batch of the target's size: not told apart).
    found = [r for r in rows if fits(r)]
    return found[0] if len(found) == 1 or found and call.batch_size != batch_size else None


def read_row(
    calls: list[CallRecord], index: int, row: int, pass_reprefill: bool = True, seq: int | None = None
) -> RowQuery:
    """The row's pending slot and proposal chain in target call `index` (see the module docstring).

    `seq`: the sequence the row is read as (default: the one the call's rows name); the draft
    calls are searched back to that sequence's previous target call.

    The chain is the longest run of consecutive draft calls (of this row, since the sequence's
    previous target call) that fed the query's slots p .. p+d-1 and proposed p+1 .. p+d, with p the
    last attended slot minus d. A draft that repeats itself proposes the same token at several
    calls, so several runs can fit the tokens: the run fed the same positions as those query slots
    wins (a catch-up call that re-feeds the last accepted draft comes before the proposals; drafts
    past a row's own length come after them), else the earliest. Positions only break ties between
    runs the tokens allow, so a position bug is still read from the first run and checked.
    Where the engine said how many drafts the row carries, only chains of that length are searched
    (for the draft calls' timings and positions), and d is what it said whether one is found or not.
    """
    verify = calls[index]
    last = last_slot(verify, row)
    parents = tree_of(verify, row)
    if parents is not None:  # a tree's nodes end at its last real slot (`tree`)
        return RowQuery(last - len(parents) + 1, len(parents) - 1, ())
    seq = row_seq_ids(verify)[row] if seq is None else seq
    flags = query_flags(verify, row)
    proposals = _draft_calls(calls, index, seq, pass_reprefill)
    said = segment_of(verify, row).drafts
    if said is None:
        lengths: Iterable[int] = range(min(len(proposals), last), 0, -1)
        said = 0  # no chain fits: no drafts read
    else:  # said: only its chain is looked for; none found, the drafts are still what it said
        said = min(said, last)
        lengths = [said] if 0 < said <= len(proposals) else []
    for d in lengths:
        p = last - d
        if not all(flags[p : last + 1]):
            continue
        chain = _fitting_chain(calls, proposals, d, seq, row, verify, p)
        if chain is not None:
            return RowQuery(p, d, chain)
    return RowQuery(last - said, said, ())


def draft_free_query(call: CallRecord, row: int, committed: list[int]) -> RowQuery | None:
    """The row's query in a run with no draft model (prompt lookup, n-gram or head drafting): no
    draft model proposed its drafts, so they are read from where a correct engine feeds them, after
    the pending token (the last committed one): the row's first real query slot when it attends a
    cache (the cache holds the tokens before it), else the slot after its re-fed context
    (`committed` tokens from its first real slot). Read from the layout, not from the attended
    count, so a stale or missing slot does not move the reading (the KV check flags it); the
    count is the fallback: d is then the attended tokens at its last slot minus the committed ones.
    None when neither fits (no drafts, or a pending slot that does not hold the last committed
    token: read as no drafts, and checked as such)."""
    if not committed:
        return None
    flags, last = query_flags(call, row), last_slot(call, row)
    first = _first_live(flags)  # past the last slot when none is live: then no pending fits
    by_layout = first if attends_cache(call, row) else first + len(committed) - 1
    by_count = last - (context_before(call, row, last) + 1 - len(committed))
    for pending in (by_layout, by_count):
        if first <= pending < last and all(flags[pending : last + 1]) and call.input_ids[row][pending] == committed[-1]:
            return RowQuery(pending, last - pending, ())
    return None


def first_slot_query(call: CallRecord, row: int) -> RowQuery | None:
    """A cached call's row with no draft model: its first real query slot is the pending token
    (the cache holds the tokens before it), the rest are drafts."""
    flags = query_flags(call, row)
    first, last = _first_live(flags), last_slot(call, row)
    if first > last or not all(flags[first : last + 1]):
        return None
    return RowQuery(first, last - first, ())


def _first_live(flags: list[int]) -> int:
    """The first attended query slot (len(flags) when none is)."""
    return next((j for j, keep in enumerate(flags) if keep), len(flags))


def attended_ids(call: CallRecord, row: int, end: int | None = None) -> list[int]:
    """The row's real query tokens up to query slot `end` (default: all of them)."""
    flags = query_flags(call, row)
    stop = len(flags) if end is None else end + 1
    ids = [t for t, keep in zip(call.input_ids[row][:stop], flags[:stop]) if keep]
    return ids or [0]


def attends_cache(call: CallRecord, row: int) -> bool:
    """Does the row attend any slot of the cache the call was given (`View.attends_cache`)? A
    sequence prefilled alone over a shared cache is given the whole cache yet attends none of it:
    a new sequence, not the row's previous one continued."""
    return call.view(row).attends_cache()


def _fitting_chain(
    calls: list[CallRecord], proposals: list[int], d: int, seq: int, row: int, verify: CallRecord, p: int
) -> tuple[tuple[int, int], ...] | None:
    """Of the runs of d consecutive draft calls that fit the query's tokens from slot p, the one
    fed the query's own positions, else the earliest; None when none fits. Runs are tried in
    order and the search stops at the first fed the query's positions (most rows: the first run
    that fits)."""
    tokens, fed = verify.input_ids[row][p : p + d + 1], list(verify.positions[row][p : p + d])
    first = None
    for start in range(len(proposals) - d + 1):
        chain = _chain(calls, proposals[start : start + d], seq, row, verify.batch_size, tokens)
        if chain is not None and fed_positions(calls, chain) == fed:
            return chain
        first = first or chain
    return first


def _chain(
    calls: list[CallRecord], run: list[int], seq: int, row: int, batch_size: int, tokens: list[int]
) -> tuple[tuple[int, int], ...] | None:
    """(call, draft row) for each call of `run` that was fed tokens[i] and proposed tokens[i + 1]."""
    chain = []
    for i, j in enumerate(run):
        hit = _draft_row(calls[j], seq, row, batch_size, tokens[i], tokens[i + 1])
        if hit is None:
            return None
        chain.append((j, hit))
    return tuple(chain)


def fed_positions(calls: list[CallRecord], chain: tuple[tuple[int, int], ...]) -> list[int]:
    """The position each draft call of the chain fed at its row's last attended slot."""
    return [calls[j].positions[dr][last_slot(calls[j], dr)] for j, dr in chain]


def _draft_calls(calls: list[CallRecord], index: int, seq: int, pass_reprefill: bool) -> list[int]:
    """Draft calls since the sequence's previous target call, in order. A target call of this
    sequence with no draft call after it and no drafts in its own query (a re-prefill between the
    proposals and the verify) is passed over, once."""
    found: list[int] = []
    passed = not pass_reprefill
    for j in range(index - 1, -1, -1):
        call = calls[j]
        if call.role != "target":
            if call.argmax is not None and not call.drafter:  # a head's proposals are read from the verify
                found.append(j)
            continue
        if seq in row_seq_ids(call):
            if found or passed or read_row(calls, j, row_seq_ids(call).index(seq), False).drafts:
                break
            passed = True
    return found[::-1]


class CallReader:
    """`read_row` for every (call, row), and the sequence the row is read as, computed once. `seq`
    None reads the row as the sequence the call's rows name; the command's row following reads a
    row whose sequence is not known yet once per candidate."""

    def __init__(self, calls: list[CallRecord]) -> None:
        self.calls = calls
        self._rows: dict[tuple[int, int, int | None], RowQuery] = {}

    def __call__(self, index: int, row: int, seq: int | None = None) -> RowQuery:
        key = (index, row, seq)
        if key not in self._rows:
            self._rows[key] = read_row(self.calls, index, row, seq=seq)
        return self._rows[key]


# ----------------------------------------------------------------------------- masks


def mask_row(call: CallRecord, row: int, rq: RowQuery) -> tuple[list[list[int]], int, bool | None]:
    """(mask_rle, attended context slots of the pending token, query block causal or None).

    The row's mask covers its context (every slot before the pending one, cached or re-fed) and
    its own d + 1 query slots; padding after its last real token is not part of it.
    """
    return call.view(row).mask_row(rq.pending, rq.drafts + 1)
