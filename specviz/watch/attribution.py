"""Which verify step each declared emission belongs to: the target call whose row fed that
sequence's pending token (`attribute`). Matching on the pending token, not on time alone, keeps
engines that report tokens one call late attributed right; an emission that starts with an earlier
call's bonus, emitted when it was fed rather than when it was chosen, is split there
(`_late_bonus`). `steps` builds the step records from these groups."""

from __future__ import annotations

from bisect import bisect_left
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
    """Each emission to the target call whose row fed that sequence's pending token; an emission
    that starts with an earlier call's bonus, emitted late, is split there (`_late_bonus`)."""
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
        previous = last_group.get(seq)
        newest = featuring[-1] if featuring else None
        if previous is not None and (not emit.tokens or newest is None or newest <= previous.call):
            # More tokens (or only the ending) for a step already attributed.
            if emit.tokens and previous.tokens:
                previous.cuts.append(len(previous.tokens))
            previous.tokens.extend(emit.tokens)
            previous.finish_reason = emit.finish_reason or previous.finish_reason
            history[seq].extend(emit.tokens)
            continue
        floor = previous.call if previous is not None else -1
        late = _late_bonus(calls, featuring, previous, seq, history[seq], emit.tokens, read, draft_free)
        if late is not None:  # its first token is an earlier call's bonus, emitted one step late
            if previous is None or previous.call != late:
                previous = Group(seq, [], None, late, emit.at)
                groups.append(previous)
            previous.tokens.append(emit.tokens[0])
            history[seq].extend(emit.tokens)
            if len(emit.tokens) == 1 and emit.finish_reason:  # it ended on that token: the newest
                previous.finish_reason = emit.finish_reason  # call's row gave nothing (idle)
                continue
            # the rest (maybe nothing yet: no draft kept) is the newest call's, which fed that token
            last_group[seq] = Group(seq, emit.tokens[1:], emit.finish_reason, featuring[-1], emit.at)
            groups.append(last_group[seq])
            continue
        call = _pending_match(calls, featuring, floor, seq, history[seq][-1], read)
        if call is None:
            notes.append(f"emit for sequence {seq} matches no target call that fed its pending token; not a step")
            history[seq].extend(emit.tokens)
            continue
        group = Group(seq, list(emit.tokens), emit.finish_reason, call, emit.at, late=call != newest)
        groups.append(group)
        last_group[seq] = group
        history[seq].extend(emit.tokens)
    return groups


def _late_bonus(
    calls: list[CallRecord],
    featuring: list[int],
    previous: Group | None,
    seq: int,
    history: list[int],
    tokens: list[int],
    read: CallReader,
    draft_free: bool,
) -> int | None:
    """The earlier target call whose bonus is `tokens[0]`, when the emission starts with it one step
    late: an engine that emits the token it feeds as pending (the prefill's first token with the
    first verify's, or every step's bonus with the next step's drafts). Read, not guessed: the
    newest call fed `tokens[0]` at its pending slot while the sequence, as emitted so far, does not
    end with it (or ends with it only as a repeat: the call fed it at the next logical index, by its
    position and by the slots it attends before it), and the earlier call's choice after what it
    already emitted was that token (the previous step's call, else the call that fed the
    sequence's last token at its pending slot)."""
    newest = featuring[-1] if featuring else None
    if not tokens or newest is None or (previous is not None and newest <= previous.call):
        return None
    row = row_seq_ids(calls[newest]).index(seq)
    slot = _pending_slot(calls, newest, row, read, draft_free)
    pending = calls[newest].input_ids[row][slot]
    if pending != tokens[0] or (pending == history[-1] and not _fed_as_next(calls[newest], row, slot, len(history))):
        return None
    earlier = featuring[:-1]
    if previous is not None:
        index, done = previous.call, len(previous.tokens)
    else:
        index, done = _pending_match(calls, earlier, -1, seq, history[-1], read), 0
    if index is None or index not in earlier:
        return None
    r = row_seq_ids(calls[index]).index(seq)
    chosen = argmax_at(calls[index], r, _pending_slot(calls, index, r, read, draft_free) + done)
    return index if chosen == tokens[0] else None


def _fed_as_next(call: CallRecord, row: int, slot: int, index: int) -> bool:
    """Was the token at `slot` fed as logical index `index` (the token after those emitted so far):
    its position and the slots it attends before it both say so (a call that fed no positions, or
    whose mask is not read, says nothing)."""
    position = call.positions[row][slot] if call.positions_fed else None
    return position == index and context_before(call, row, slot) == index


def _pending_slot(calls: list[CallRecord], index: int, row: int, read: CallReader, draft_free: bool) -> int:
    """The row's pending slot: where its chain of draft calls starts, or, with no draft model, its
    first real query slot when it attends a cache (the drafts are not known before attribution)."""
    if draft_free and attends_cache(calls[index], row):
        first = first_slot_query(calls[index], row)
        if first is not None:
            return first.pending
    return read(index, row).pending


def _pending_match(
    calls: list[CallRecord], featuring: list[int], floor: int, seq: int, pending: int, read: CallReader
) -> int | None:
    fallback = None
    for i in reversed(featuring):
        if i <= floor:
            break
        row = row_seq_ids(calls[i]).index(seq)
        fallback = i if fallback is None else fallback
        if calls[i].input_ids[row][read(i, row).pending] == pending:
            return i
    return fallback
