"""Which verify step each declared emission belongs to (`attribute`): the target call whose row fed the
sequence's pending token, not the latest by time alone, so engines that report tokens one call late
(HF `generate` with deferred stop checks) are read right. Endings are as emitted, an emitted EOS, or
the budget (`max_new_tokens`, never declared: read from where sequences ended by length)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

from specviz.watch.calls import CallReader, argmax_at, first_slot_query, segment_of


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
    emits: list[Emit], prompts: list[list[int]], read: CallReader, notes: list[str], draft_free: bool
) -> list[Group]:
    """Each emission as a group of the target call (of `read.calls`) whose row fed its pending token;
    one that starts with an earlier call's bonus, emitted late, is split there (`_Rows.late_bonus`)."""
    calls, rows = read.calls, _Rows(read, draft_free)
    history = {seq_id: list(ids) for seq_id, ids in enumerate(prompts)}
    featured: dict[int, list[int]] = {}  # sequence -> the target calls that held it, in order
    for i, call in enumerate(calls):
        if call.role == "target":
            # A row said to be a prefill chunk fed its prompt, no pending token: no step of its sequence.
            for r, seq in enumerate(call.seq_ids):
                if not segment_of(call, r).chunk:
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
        late = rows.late_bonus(featuring, previous, seq, (last, done), emit.tokens)
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
            call, tokens = rows.pending_match(featuring, floor, seq, last), emit.tokens
        if call < 0:
            notes.append(f"emit for sequence {seq} matches no target call that fed its pending token; not a step")
            continue
        last_group[seq] = Group(seq, list(tokens), emit.finish_reason, call, emit.at, late=call != newest)
        groups.append(last_group[seq])
    return groups


@dataclass
class _Rows:
    """The pending token of a sequence's row in the target calls, read through `read`."""

    read: CallReader
    draft_free: bool  # no draft model: drafts are not known before attribution

    def pending_slot(self, index: int, seq: int) -> tuple[int, int]:
        """(row, pending slot) of the sequence in call `index` (no draft model: its first real slot)."""
        call = self.read.calls[index]
        row = call.seq_ids.index(seq)
        rq = self.read(index, row)
        if self.draft_free and call.views[row].attends_cache() and segment_of(call, row).drafts is None:
            rq = first_slot_query(call, row) or rq
        return row, rq.pending

    def pending_match(self, featuring: list[int], floor: int, seq: int, pending: int) -> int:
        """The newest call after `floor` whose row fed `pending` as pending, else the newest (-1: none)."""
        after = featuring[bisect_right(featuring, floor) :]

        def fed(i: int) -> int:
            row = self.read.calls[i].seq_ids.index(seq)
            return self.read.calls[i].input_ids[row][self.read(i, row).pending]

        return next((i for i in reversed(after) if fed(i) == pending), max(after, default=-1))

    def late_bonus(
        self, featuring: list[int], previous: Group | None, seq: int, emitted: tuple[int, int], tokens: list[int]
    ) -> int | None:
        """The earlier target call whose bonus is `tokens[0]`, emitted one step late by an engine that
        emits the token it feeds as pending. Read, not guessed: the newest call fed it as pending while
        the sequence so far (`emitted`: its last token, its length) does not end with it, or does only
        as a repeat, and the earlier call chose it after what it emitted."""
        if not tokens or len(featuring) < 2:  # no earlier call (a previous step's is older than the newest)
            return None
        newest = self.read.calls[featuring[-1]]
        row, slot = self.pending_slot(featuring[-1], seq)
        pending, (last, length) = newest.input_ids[row][slot], emitted
        if pending != tokens[0] or (
            pending == last  # a repeat of the last token only where fed as the next index (position and mask)
            and not (newest.positions_fed and newest.positions[row][slot] == length == newest.views[row].before(slot))
        ):
            return None
        if previous is not None:  # the previous step's call, which is among the earlier ones
            index, done = previous.call, len(previous.tokens)
        else:
            index, done = self.pending_match(featuring[:-1], -1, seq, last), 0
        row, slot = self.pending_slot(index, seq)
        return index if argmax_at(self.read.calls[index], row, slot + done) == tokens[0] else None


def endings(
    groups: list[Group], emits: list[Emit], prompts: list[list[int]], eos: frozenset[int]
) -> tuple[dict[int, list[int]], dict[int, str | None]]:
    """Outputs as emitted (the engine's word), and endings: declared, or an emitted EOS."""
    outputs: dict[int, list[int]] = {seq_id: [] for seq_id in range(len(prompts))}
    reasons: dict[int, str | None] = dict.fromkeys(outputs)
    for emit in emits:
        outputs[emit.seq_id].extend(emit.tokens)
        reasons[emit.seq_id] = emit.finish_reason or reasons[emit.seq_id]
    # A step that emitted an EOS ends there; so does its sequence (its outputs hold every token).
    for group in groups:
        group.finish_reason = _or_eos(group.finish_reason, group.tokens, eos)
    for seq_id, tokens in outputs.items():
        reasons[seq_id] = _or_eos(reasons[seq_id], tokens, eos)
    return outputs, reasons


def _or_eos(reason: str | None, tokens: list[int], eos: frozenset[int]) -> str | None:
    """The ending declared, else "eos" where the tokens hold an EOS."""
    return reason or ("eos" if eos.intersection(tokens) else None)


def budgets(outputs: dict[int, list[int]], reasons: dict[int, str | None]) -> tuple[dict[int, int], int]:
    """Each sequence ended by length with its length (its own budget), and the run's `max_new_tokens`
    (never declared): the largest of those, else the longest output."""
    own = {seq_id: len(outputs[seq_id]) for seq_id, reason in reasons.items() if reason == "length"}
    return own, max(own.values(), default=max((len(o) for o in outputs.values()), default=0))


def close_by_length(
    groups: list[Group], outputs: dict[int, list[int]], reasons: dict[int, str | None], max_new: int
) -> None:
    """A sequence that reached the budget without a declared ending ended by length; its last step
    without an ending of its own ends as the sequence did."""
    for seq_id, tokens in outputs.items():
        if reasons[seq_id] is None and max_new and len(tokens) >= max_new:
            reasons[seq_id] = "length"
    for seq_id, group in {g.seq_id: g for g in groups}.items():  # each sequence's last group
        group.finish_reason = group.finish_reason or reasons[seq_id]
