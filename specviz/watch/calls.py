"""Reading one row of one materialized captured call: its query (padding on either side), its pending
slot and draft chain (`RowQuery`, `read_row`), the argmax at a slot, the mask row it was fed, and the
tokens it verified: which emitted tokens fit them, and what they accepted."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

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
    """What the call's map says of the row (`drafts` ending its query, None: not said; `chunk`: a
    prefill chunk, no step); nothing where the call has no readable map."""
    segments = call.map.segments if call.map is not None else ()
    return segments[row] if len(segments) == call.batch_size else _UNSAID


def tree_of(call: CallRecord, row: int) -> list[int] | None:
    """The parents of the tree the row verifies (`tree.read_trees`); None for a chain row."""
    return call.trees[row] if call.trees else None


def query_flags(call: CallRecord, row: int) -> list[int]:
    """1 for each query slot of `row` that is attended (a real token), 0 for padding."""
    return call.query_flags(row)


def last_slot(call: CallRecord, row: int) -> int:
    """The row's last attended query slot."""
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


def _draft_row(call: CallRecord, seq: int, row: int, batch_size: int, fed: int, out: int, at: int) -> int | None:
    """The row of draft call `call` fed `fed` at position `at` that proposed `out` for sequence `seq`
    (row `row` of a target batch of `batch_size`): the declared row, else the same index in a batch
    of that size, else the row whose tokens fit (of several, those fed at `at`)."""
    if call.rows is not None:  # declared (the batch map keeps a draft call's rows only at its size)
        found = [r for r in _rows_fed(call, fed, out) if call.rows[r] == seq]
    elif call.batch_size == batch_size and row in _rows_fed(call, fed, out):  # the same rows: the same index
        return row
    else:
        found = _rows_fed(call, fed, out)
    # Else another order (a packed draft call packs its rows its own way) or other rows: the row
    # whose tokens fit, when one does; sequences that were fed and proposed alike (a trained draft
    # often proposes the same after the same token) by the position they were fed at. Several in
    # a batch of the target's size: not told apart.
    found = [r for r in found if call.positions[r][last_slot(call, r)] == at] or found
    return found[0] if len(found) == 1 or found and call.batch_size != batch_size else None


def _rows_fed(call: CallRecord, fed: int, out: int) -> list[int]:
    """The rows of a draft call whose last attended slot was fed `fed` and proposed `out` (the
    proposal is not compared where the argmax is not the engine's choice), in row order. Indexed
    once per call: every sequence's chain asks every draft call, so a scan per ask grows with the
    cube of the batch."""
    if call.fed_rows is None:
        call.fed_rows = {}
        for r in range(call.batch_size):
            last = last_slot(call, r)
            said = argmax_at(call, r, last) if call.argmax_is_choice else None
            call.fed_rows.setdefault((call.input_ids[r][last], said), []).append(r)
    return call.fed_rows.get((fed, out if call.argmax_is_choice else None), [])


def read_row(
    calls: list[CallRecord],
    index: int,
    row: int,
    pass_reprefill: bool = True,
    seq: int | None = None,
    memo: dict[tuple[Any, ...], RowQuery] | None = None,
) -> RowQuery:
    """The row's pending slot p and chain in target call `index`, read as sequence `seq` (default:
    the call's). The chain is the longest run of the sequence's draft calls since its previous
    target call that fed query slots p .. p+d-1 and proposed p+1 .. p+d (p: the last attended slot
    minus d); of several runs that fit (a draft that repeats itself), the one fed those slots'
    positions, else the earliest, so a position bug is still read and checked. Drafts the engine
    said (`segment_of`) fix d, chain found or not. `memo`: readings kept by what they depend on."""
    verify = calls[index]
    last = last_slot(verify, row)
    parents = tree_of(verify, row)
    if parents is not None:  # a tree's nodes end at its last real slot (`tree`)
        return RowQuery(last - len(parents) + 1, len(parents) - 1, ())
    seq = row_seq_ids(verify)[row] if seq is None else seq
    proposals = _draft_calls(calls, index, seq, pass_reprefill)
    # The sequence a row is read as changes its reading only through its draft calls and, where a
    # draft call declared its rows, the row it names: candidates of the same draft calls share one.
    if memo is None:
        return _chain_query(calls, verify, row, seq, proposals, last)
    declared = any(calls[j].rows is not None for j in proposals)
    key = (index, row, tuple(proposals), seq if declared else None)
    if key not in memo:
        memo[key] = _chain_query(calls, verify, row, seq, proposals, last)
    return memo[key]


def _chain_query(
    calls: list[CallRecord], verify: CallRecord, row: int, seq: int, proposals: list[int], last: int
) -> RowQuery:
    """`read_row` once the draft calls are known: the longest chain that fits, else the drafts said."""
    flags = query_flags(verify, row)
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
    """The row's query with no draft model (prompt lookup, n-gram, a head): drafts follow the pending
    token (the last `committed` one), at the first real slot when the row attends a cache, else
    after its re-fed context; by layout, so a stale slot does not move it (the KV check flags it),
    else by the attended count. None when neither fits: read as no drafts, and checked as such."""
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
    """A cached row with no draft model: its first real query slot is pending, the rest drafts."""
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
    """Does the row attend any cache slot (a sequence prefilled alone over a shared cache does not)?"""
    return call.view(row).attends_cache()


def _fitting_chain(
    calls: list[CallRecord], proposals: list[int], d: int, seq: int, row: int, verify: CallRecord, p: int
) -> tuple[tuple[int, int], ...] | None:
    """Of the runs of d consecutive draft calls that fit the query's tokens from slot p, the first fed
    the query's own positions, else the earliest; None when none fits."""
    tokens, fed = verify.input_ids[row][p : p + d + 1], list(verify.positions[row][p : p + d])
    first, size = None, verify.batch_size
    for start in range(len(proposals) - d + 1):
        run = proposals[start : start + d]  # each call fed tokens[i] and proposed tokens[i + 1]
        hits = [_draft_row(calls[j], seq, row, size, *tokens[i : i + 2], fed[i]) for i, j in enumerate(run)]
        if None in hits:
            continue
        chain = tuple(zip(run, hits))
        if fed_positions(calls, chain) == fed:
            return chain
        first = first or chain
    return first


def fed_positions(calls: list[CallRecord], chain: tuple[tuple[int, int], ...]) -> list[int]:
    """The position each draft call of the chain fed at its row's last attended slot."""
    return [calls[j].positions[dr][last_slot(calls[j], dr)] for j, dr in chain]


def _draft_calls(calls: list[CallRecord], index: int, seq: int, pass_reprefill: bool) -> list[int]:
    """Draft calls since the sequence's previous target call, passing over once a re-prefill of it
    (a target call with no draft call after it and no drafts in its own query)."""
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
    """`read_row` for every (call, row, sequence read as: None for the call's), computed once."""

    def __init__(self, calls: list[CallRecord]) -> None:
        self.calls = calls
        self._rows: dict[tuple[int, int, int | None], RowQuery] = {}
        self._memo: dict[tuple[Any, ...], RowQuery] = {}  # `read_row`'s, across the sequences read as

    def __call__(self, index: int, row: int, seq: int | None = None) -> RowQuery:
        key = (index, row, seq)
        if key not in self._rows:
            self._rows[key] = read_row(self.calls, index, row, seq=seq, memo=self._memo)
        return self._rows[key]


def mask_row(call: CallRecord, row: int, rq: RowQuery) -> tuple[list[list[int]], int, bool | None]:
    """(mask_rle over the context and the d + 1 query slots, the pending token's attended context
    slots, the query block causal or None)."""
    return call.view(row).mask_row(rq.pending, rq.drafts + 1)


def row_tokens(call: CallRecord, row: int, rq: RowQuery) -> tuple[list[int], list[int]]:
    """(the row's d drafts, the target's argmax at its d + 1 query slots, or [] if not kept)."""
    drafts = list(call.input_ids[row][rq.pending + 1 : rq.pending + 1 + rq.drafts])
    targets = [argmax_at(call, row, rq.pending + i) for i in range(rq.drafts + 1)]
    return drafts, ([] if None in targets else targets)


def consistent(tokens: list[int], drafts: list[int], targets: list[int], free_last: bool = False) -> bool:
    """Tokens read as some drafts, then maybe one more: the target's own token at that slot, or any
    token when the argmax is not the engine's choice (`free_last`)."""
    n = _agree(tokens, drafts)
    rest = tokens[n:]  # after the drafts they repeat: nothing, or the one token the target chose
    return rest in ([], targets[n : n + 1]) or free_last and len(rest) == 1


def _agree(a: list[int], b: list[int]) -> int:
    """How many leading items `a` and `b` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def matched_prefix(drafts: list[int], targets: list[int]) -> int | None:
    """The drafts the target agrees with, None unless it chose one token per draft and one more."""
    return _agree(drafts, targets) if len(targets) == len(drafts) + 1 else None


def accepted_and_bonus(tokens: list[int], drafts: list[int], targets: list[int]) -> tuple[int, int | None]:
    """(accepted, bonus) as emitted: a prefix of the greedy-correct output accepts what verification
    allowed (emitting fewer is speed lost, not a wrong answer), else the drafts emitted."""
    matched = matched_prefix(drafts, targets)
    greedy = matched is not None and tokens == (drafts[:matched] + [targets[matched]])[: len(tokens)]
    accepted = matched if greedy else _agree(tokens, drafts)
    return accepted, tokens[accepted] if len(tokens) == accepted + 1 else None
