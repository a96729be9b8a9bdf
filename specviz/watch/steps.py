"""From captured calls and declared emissions to the trace's step records, read from what the models
were fed, never from a fixed k: a target call is a verify step when an emission is attributed to it
(`attribution`), each row read by `calls.CallReader`. The row credited with an emission is the one
its tokens fit (`assign_rows`), so a write-back to the wrong sequence shows as `write_seq != seq_id`."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

from specviz.trace.schema import RowRecord, StepRecord
from specviz.watch import tree
from specviz.watch.attribution import Emit, Group, attribute, budgets, close_by_length, endings
from specviz.watch.calls import (
    CallReader,
    RowQuery,
    accepted_and_bonus,
    attended_ids,
    consistent,
    fed_positions,
    row_seq_ids,
    row_tokens,
    sampled_drafts,
    segment_of,
    tree_of,
)
from specviz.watch.content import ContentCheck
from specviz.watch.headinput import head_source, unfound_note
from specviz.watch.record import CallRecord


@dataclass
class InferredSteps:
    """The whole watched inference as `infer_steps` reads it: step records, outputs, endings, k."""

    steps: list[StepRecord]
    outputs: dict[int, list[int]]
    finish_reasons: dict[int, str | None]
    k: int
    max_new_tokens: int
    notes: list[str] = field(default_factory=list)
    first_call_at: float | None = None
    last_event_at: float | None = None
    unreadable: tuple[int, str] | None = None  # (step S, why): the calls from there on were not read
    budgets: dict[int, int] = field(default_factory=dict)  # seq -> its own budget (ended by "length")
    content: list[ContentCheck] = field(default_factory=list)  # rows whose cache's keys were copied


def build_steps(
    groups: list[Group],
    prompts: list[list[int]],
    read: CallReader,
    draft_free: bool,
    content: list[ContentCheck] | None = None,
) -> list[StepRecord]:
    """One step record per target call emissions were attributed to, its rows read by `read.step_rows`
    (`draft_free`: no draft calls ran); each row whose call's keys were copied joins `content`."""
    calls = read.calls
    by_call: dict[int, list[Group]] = {}  # call index -> the groups attributed to it
    for group in groups:
        by_call.setdefault(group.call, []).append(group)
    committed = {seq_id: list(ids) for seq_id, ids in enumerate(prompts)}
    running = set(committed)  # the sequences not finished yet
    steps: list[StepRecord] = []
    trees: dict[int, tuple[RowRecord, int, int]] = {}  # seq -> its latest tree row: (record, call index, row)
    for index in sorted(by_call):
        call = calls[index]
        shown = read.step_rows(index, committed, draft_free)
        produced = assign_rows(call, by_call[index], shown, running)
        before = tree.draft_calls_before(calls, index)
        heads = [j for j in before if calls[j].drafter]  # a draft head's calls: the step's proposals
        # A tree's drafts are read from the verify: every draft call since is its proposal.
        rows, proposals = [], set(before if call.trees else heads)
        cached = any(call.views[r].cache for r in range(call.batch_size))  # else every row of a re-prefill is read
        for r, seq_id in enumerate(row_seq_ids(call)):
            # A row that produced nothing and is no step of its sequence: idle (a finished
            # sequence's row the engine still computes, or a static slot fed only padding while
            # another is prefilled), a prefill chunk said so (KV written, no token), or a
            # newcomer's prefill riding in another's step (vLLM mixes them in): a sequence not yet
            # stepped fed its prompt's next tokens, in a call where some row reads a cache.
            if r not in produced and (
                seq_id not in running
                or not any(call.views[r].flags)
                or segment_of(call, r).chunk
                or (cached and len(committed[seq_id]) == len(prompts[seq_id]) and _prefills(call, r, prompts[seq_id]))
            ):
                continue
            proposals.update(j for j, _ in shown[r].chain)
            group = produced.get(r, Group(seq_id, [], None, index, call.started))  # nothing produced
            rows.append(_row_record(calls, index, r, seq_id, shown[r], group, len(committed[seq_id]), heads))
            if content is not None and call.views[r].cache:  # its cache holds the tokens before the pending one
                keys = None if call.keys0 is None or call.segments else call.keys0[r]  # (a cut packed row: shared)
                content.append(ContentCheck(rows[-1], keys, committed[seq_id][:-1]))
            if rows[-1].tree_parents is not None:  # the sequence's previous tree row: the nodes of it this one attends
                earlier = trees.get(seq_id)
                if earlier is not None and not earlier[0].finished:
                    record, j, r0 = earlier
                    record.kept_nodes = tree.kept_nodes(calls[j], r0, read(j, r0), call, r, read(index, r))
                trees[seq_id] = (rows[-1], index, r)
        for i, row in enumerate(rows):
            row.row = i  # its place among the step's rows
            committed[row.write_seq].extend(row.emitted)
            if row.finished:
                running.discard(row.write_seq)
        started = calls[min(proposals, default=index)].started  # the first proposal, else the verify
        steps.append(
            StepRecord(
                step=len(steps),
                batch_id=0,
                cache_len=max(call.views[r].cache + rq.pending for r, rq in enumerate(shown)),
                query_len=max(rq.drafts for rq in shown) + 1,
                grouped=None,
                draft_ms=round(sum(calls[j].ended - calls[j].started for j in proposals) * 1000, 4),
                verify_ms=round((call.ended - call.started) * 1000, 4),
                align_ms=0.0,
                total_ms=round((call.ended - started) * 1000, 4),
                rows=rows,
            )
        )
    pads: dict[int, int] = {}  # what a continuing row's sequence shows at its next step: its padding then
    for step in reversed(steps):
        for row in step.rows:
            row.left_pad_after = None if row.finished else pads.get(row.seq_id)
            pads[row.seq_id] = row.left_pad
    return steps


def _prefills(call: CallRecord, row: int, prompt: list[int]) -> bool:
    """Did the row feed the prompt's next tokens after its cache's, short of its end (a decode feeds the last)?"""
    fed, c = attended_ids(call, row), call.views[row].cache  # (a row fed nothing is idle, never asked)
    return c + len(fed) < len(prompt) and fed == prompt[c : c + len(fed)]


def assign_rows(call: CallRecord, groups: list[Group], shown: list[RowQuery], running: set[int]) -> dict[int, Group]:
    """Which row produced each group: its own if consistent, else a `running` sequence's row it is
    consistent with (each row read as `shown`)."""
    rows = row_seq_ids(call)
    free_last = not call.argmax_is_choice

    def fits(group: Group, r: int) -> bool:
        drafts, targets = row_tokens(call, r, shown[r])
        parents = tree_of(call, r)
        if parents is not None:  # a path of the row's tree, then its choice there
            nodes = [call.input_ids[r][shown[r].pending], *drafts]
            return tree.consistent(group.tokens, parents, nodes, targets, free_last)
        return consistent(group.tokens, drafts, targets, free_last)

    taken: dict[int, Group] = {}

    def place(group: Group) -> bool:
        own = rows.index(group.seq_id)
        if own not in taken and fits(group, own):
            taken[own] = group
            return True
        return False

    def split(group: Group) -> list[tuple[int, Group]] | None:
        """The group as consecutive pieces cut where its emits were appended, each fitting a distinct
        free row (its own first), longest first; None when none fits. No piece carries its ending."""
        own, bounds = rows.index(group.seq_id), [0, *group.cuts, len(group.tokens)]

        def search(a: int, free_rows: set[int]) -> list[tuple[int, Group]] | None:
            if a == len(bounds) - 1:
                return []
            for b in range(len(bounds) - 1, a, -1):  # the longest piece first
                piece = Group(group.seq_id, group.tokens[bounds[a] : bounds[b]], None, group.call, group.at)
                for r in sorted(free_rows, key=lambda r: (r != own, r)):  # its own row first, then in order
                    if fits(piece, r):
                        rest = search(b, free_rows - {r})
                        if rest is not None:
                            return [(r, piece), *rest]
            return None

        return search(0, {r for r in range(len(rows)) if r not in taken and rows[r] in running})

    # A late group (emitted after a newer call of its sequence: maybe that call's tokens, matched
    # here by its pending token) places after the on-time groups have been read, split included.
    # An on-time group that missed its own row tries it again in vain (still taken, or unfit).
    unfit = []
    for group in [g for g in groups if not g.late and not place(g)] + [g for g in groups if g.late]:
        if place(group):
            continue
        pieces = split(group)
        if pieces is None:
            unfit.append(group)
            continue
        pieces[-1][1].finish_reason = group.finish_reason  # the group's ending is its last piece's
        taken.update(pieces)
    for group in unfit:  # fits no row, whole or split: its own row shows what it got
        taken.setdefault(rows.index(group.seq_id), group)
    return taken


def _row_record(
    calls: list[CallRecord], index: int, r: int, seq: int, rq: RowQuery, group: Group, committed: int, heads: list[int]
) -> RowRecord:
    """Row `r` of target call `index` read as `rq`, credited with `group`, its sequence holding
    `committed` tokens; `heads`: the step's draft head calls."""
    call = calls[index]
    drafts, targets = row_tokens(call, r, rq)
    accepted, bonus = accepted_and_bonus(group.tokens, drafts, targets)
    runs, context, causal = call.views[r].mask_row(rq.pending, rq.drafts + 1)
    lead = next((n for value, n in runs[:1] if value == 0), 0)  # the padding the mask starts with
    shape: dict[str, Any] = {}  # the optional fields recorded (RowRecord's defaults: None)
    if tree_of(call, r) is not None:  # a tree row (schema 3): its own path and mask reading
        shape = tree.tree_fields(call, r, rq, group.tokens, targets)
        accepted, bonus = shape.pop("accepted"), shape.pop("bonus")
        read = tree.mask_row(call, r, rq)
        if read is not None:
            runs, context = read
        causal = None
    # The positions the row's draft calls fed, and the context each attended where every mask was read.
    contexts = [calls[j].views[dr].before(calls[j].last_slots[dr]) for j, dr in rq.chain]
    if rq.chain:
        shape["draft_position_ids"] = fed_positions(calls, rq.chain)
    if min(contexts, default=-1) >= 0:
        shape.update(draft_kv_lens=contexts, draft_kv_len=contexts[0], draft_kv_len_expected=committed - 1)
    return RowRecord(
        row=r,
        seq_id=seq,
        committed_before=committed,
        left_pad=min(lead, call.views[r].cache + rq.pending),
        left_pad_after=None,
        pending_token=call.input_ids[r][rq.pending],
        draft_tokens=drafts,
        target_tokens=targets,
        accepted=accepted,
        bonus=bonus,
        emitted=list(group.tokens),
        write_seq=group.seq_id,
        position_ids=list(call.positions[r][rq.pending : rq.pending + rq.drafts + 1]),
        mask_rle=runs,
        kv_len=max(context, 0),
        kv_len_expected=committed - 1,
        finished=group.finish_reason is not None,
        finish_reason=group.finish_reason,
        query_causal=causal,
        head_source=head_source(calls, index, heads, r, drafts, seq, committed),
        **shape,
    )


def infer_steps(
    calls: list[CallRecord],
    emits: list[Emit],
    prompts: list[list[int]],
    eos: frozenset[int],
    argmax_is_choice: bool = True,
) -> InferredSteps:
    """Steps and endings from captured calls and declared emits, stopping before the first unmapped
    target call a step would be read from. `argmax_is_choice`: False when the engine samples."""
    for call in calls:
        call.materialize()
        call.argmax_is_choice = argmax_is_choice
        call.fed_rows = None  # indexed while following, keyed by argmax: stale once it is not the choice
    notes: list[str] = []
    targets = [i for i, c in enumerate(calls) if c.role == "target"]
    sampled = sampled_drafts(calls, targets) if argmax_is_choice else None
    if sampled is not None:  # read as greedy from there on, a correct run would show false violations
        calls[sampled[0]].mark_unreadable(f"{sampled[1]}; declare it: specviz.watch(..., temperature=)")
    # Read up to the first unmapped target call an emission follows (its last target call before it).
    stepped = {targets[t - 1] for t in (bisect_left(targets, emit.after) for emit in emits) if t}
    end = min((i for i in stepped if calls[i].unreadable is not None), default=len(calls))
    read_calls = calls[:end]
    # Every emit when all was read: a command's emits count the calls of models it then drops.
    read_emits = emits if end == len(calls) else [e for e in emits if e.after <= end]
    read = CallReader(read_calls)
    draft_free = not any(c.role == "draft" and not c.drafter for c in calls)
    groups = attribute(read_emits, prompts, read, notes, draft_free)
    outputs, reasons = endings(groups, emits, prompts, eos)
    own_budgets, max_new = budgets(outputs, reasons)
    # Unread from the cut on: an ending declared after it is not the ending of the last step read.
    ended_unread = {e.seq_id for e in emits[len(read_emits) :]}
    close_by_length([g for g in groups if g.seq_id not in ended_unread], outputs, reasons, max_new)
    content: list[ContentCheck] = []
    steps = build_steps(groups, prompts, read, draft_free, content)
    if any(c.drafter for c in read_calls):
        notes.extend(unfound_note(steps))
    k = max((len(row.draft_tokens) for step in steps for row in step.rows), default=0)
    events = [c.started for c in calls] + [e.at for e in emits]
    first, last = min((c.started for c in calls), default=None), max(events, default=None)
    unread = None if end == len(calls) else (len(steps), f"target call {end}: {calls[end].unreadable}")
    return InferredSteps(steps, outputs, reasons, k, max_new, notes, first, last, unread, own_budgets, content)
