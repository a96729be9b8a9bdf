"""Which verify step each declared emission belongs to (`attribute`): the target call whose row fed
that sequence's pending token, not the latest by time alone, so engines that report tokens one call
late (HF `generate` with deferred stop checks) are read right. `steps` builds the step records."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

from specviz.watch.calls import (
    CallReader,
    argmax_at,
    attends_cache,
    context_before,
    first_slot_query,
    row_seq_ids,
)
from specviz.watch.record import CallRecord


@dataclass
class Emit:
    """One `emit` as declared: tokens appended to a sequence, after `after` captured calls."""

    seq_id: int
    tokens: list[int]
    finish_reason: str | None
    after: int
    at: float  # perf_counter when declared


@dataclass
class Group:
    """All tokens one sequence received in one step, attributed to one target call."""

    seq_id: int
    tokens: list[int]
    finish_reason: str | None
    call: int  # index into the call list
    at: float
    cuts: list[int] = field(default_factory=list)  # where later emits were appended (token offsets)
    late: bool = False  # emitted after a newer target call that held the sequence: weaker evidence


def attribute(
    calls: list[CallRecord],
    emits: list[Emit],
    prompts: list[list[int]],
    read: CallReader,
    notes: list[str],
    draft_free: bool = False,
) -> list[Group]:
    """Each emission as a group of the target call whose row fed its pending token; one that starts
    with an earlier call's bonus, emitted late, is split there (`_late_bonus`)."""
    history = {seq_id: list(ids) for seq_id, ids in enumerate(prompts)}
    featured: dict[int, list[int]] = {}  # sequence -> the target calls that held it, in order
    for i, call in enumerate(calls):
        if call.role == "target":
            for seq in row_seq_ids(call):
                featured.setdefault(seq, []).append(i)
    last_group: dict[int, Group] = {}
    groups: list[Group] = []
    for emit in emits:
        seq = emit.seq_id
        held = featured.get(seq, [])
        featuring = held[: bisect_left(held, emit.after)]  # the calls before the emit
        last, done = history[seq][-1], len(history[seq])  # the sequence as emitted so far
        history[seq].extend(emit.tokens)
        previous = last_group.get(seq)
        floor = previous.call if previous is not None else -1
        newest = max(featuring, default=-1)
        if previous is not None and (not emit.tokens or newest <= floor):
            # More tokens (or only the ending) for a step already attributed: no newer call held it.
            if emit.tokens and previous.tokens:
                previous.cuts.append(len(previous.tokens))
            previous.tokens.extend(emit.tokens)
            previous.finish_reason = emit.finish_reason or previous.finish_reason
            continue
        late = _late_bonus(calls, featuring, previous, seq, (last, done), emit.tokens, read, draft_free)
        if late is not None:  # its first token is an earlier call's bonus, emitted one step late
            if previous is None:  # else `late` is the previous step's call
                previous = Group(seq, [], None, late, emit.at)
                groups.append(previous)
            previous.tokens.append(emit.tokens[0])
            if len(emit.tokens) == 1 and emit.finish_reason:  # it ended on that token: the newest
                previous.finish_reason = emit.finish_reason  # call's row gave nothing (idle)
                continue
            # the rest (maybe nothing yet: no draft kept) is the newest call's, which fed that token
            call, tokens = newest, emit.tokens[1:]
        else:
            call, tokens = _pending_match(calls, featuring, floor, seq, last, read), emit.tokens
        if call is None:
            notes.append(f"emit for sequence {seq} matches no target call that fed its pending token; not a step")
            continue
        last_group[seq] = Group(seq, list(tokens), emit.finish_reason, call, emit.at, late=call != newest)
        groups.append(last_group[seq])
    return groups


def _late_bonus(
    calls: list[CallRecord],
    featuring: list[int],
    previous: Group | None,
    seq: int,
    emitted: tuple[int, int],
    tokens: list[int],
    read: CallReader,
    draft_free: bool,
) -> int | None:
    """The earlier target call whose bonus is `tokens[0]`, emitted one step late by an engine that
    emits the token it feeds as pending (the prefill's first token with the first verify's, or each
    bonus with the next drafts). Read, not guessed: the newest call fed `tokens[0]` as pending
    while the sequence so far (`emitted`: its last token, its length) does not end with it, or does
    only as a repeat (fed at the next logical index, by position and by the slots it attends), and
    the earlier call (the previous step's, else the one that fed the last token as pending) chose
    that token after what it already emitted."""
    if not tokens or not featuring:
        return None
    newest = featuring[-1]
    row = row_seq_ids(calls[newest]).index(seq)
    slot = _pending_slot(calls, newest, row, read, draft_free)
    pending, (last, length) = calls[newest].input_ids[row][slot], emitted
    if pending != tokens[0] or (pending == last and not _fed_as_next(calls[newest], row, slot, length)):
        return None
    if previous is not None:  # the previous step's call, which is among the earlier ones
        index, done = previous.call, len(previous.tokens)
    else:  # one of the earlier calls, or None
        index, done = _pending_match(calls, featuring[:-1], -1, seq, last, read), 0
    if index is None:
        return None
    r = row_seq_ids(calls[index]).index(seq)
    chosen = argmax_at(calls[index], r, _pending_slot(calls, index, r, read, draft_free) + done)
    return index if chosen == tokens[0] else None


def _fed_as_next(call: CallRecord, row: int, slot: int, index: int) -> bool:
    """The token at `slot` was fed as logical index `index`, by its position and by the slots it
    attends before it (a call that fed no positions, or whose mask is not read, says nothing)."""
    return call.positions_fed and call.positions[row][slot] == index and context_before(call, row, slot) == index


def _pending_slot(calls: list[CallRecord], index: int, row: int, read: CallReader, draft_free: bool) -> int:
    """The row's pending slot: where its draft chain starts, or, with no draft model, its first real
    query slot when it attends a cache (the drafts are not known before attribution)."""
    if draft_free and attends_cache(calls[index], row):
        first = first_slot_query(calls[index], row)
        if first is not None:
            return first.pending
    return read(index, row).pending


def _pending_match(
    calls: list[CallRecord], featuring: list[int], floor: int, seq: int, pending: int, read: CallReader
) -> int | None:
    """The newest call after `floor` whose row fed `pending` as the sequence's pending token, else
    the newest after `floor` (None: none is)."""
    after = featuring[bisect_right(featuring, floor) :]

    def fed(i: int) -> int:
        row = row_seq_ids(calls[i]).index(seq)
        return calls[i].input_ids[row][read(i, row).pending]

    return next((i for i in reversed(after) if fed(i) == pending), max(after, default=None))
