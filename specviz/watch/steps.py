"""From captured calls and declared emissions to the trace's step records, read from what the models
were fed, never from a fixed k: a target call is a verify step when an emission is attributed to it
(`attribution`), its rows read by `calls.read_step`. The row credited with an emission is the one
its tokens walk (`tree.credit`: a chain is a tree), so a write-back to the wrong sequence shows as
`write_seq != seq_id`. The value goes one way: calls, then paths (`tree`), then the head's input."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from specviz.trace.schema import RowRecord, StepRecord
from specviz.watch import tree
from specviz.watch.attribution import Emit, Group, attribute, budgets, close_by_length, endings
from specviz.watch.calls import CallReader, RowRead, read_step, sampled_drafts
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
    content: list[ContentCheck],
) -> list[StepRecord]:
    """One step record per target call emissions were attributed to, in four beats: its rows read
    (`calls.read_step`; `draft_free`: no draft calls ran), the groups credited to the rows whose
    trees they walk (`tree.credit`), each row's path, then its head's input (`headinput`). Each
    row whose call's keys were copied joins `content`."""
    calls = read.calls
    by_call: dict[int, list[Group]] = {}  # call index -> the groups attributed to it
    for group in groups:
        by_call.setdefault(group.call, []).append(group)
    committed = {seq_id: list(ids) for seq_id, ids in enumerate(prompts)}
    running = set(committed)  # the sequences not finished yet
    steps: list[StepRecord] = []
    trees: dict[int, tuple[RowRecord, int, RowRead]] = {}  # seq -> its latest tree row: (record, call, read)
    for index in sorted(by_call):
        call = calls[index]
        step = read_step(read, index, committed, prompts, running, draft_free)
        produced = tree.credit(step.rows, by_call[index], running, not call.argmax_is_choice)
        # A tree's drafts are read from the verify: every draft call since is its proposal.
        rows, proposals = [], set(step.drafted if any(call.trees) else step.heads)
        for row in step.rows:
            if row.row not in produced and row.passive:
                continue
            proposals.update(j for j, _ in row.rq.chain)
            group = produced.get(row.row, Group(row.seq_id, [], None, index, call.started))  # nothing produced
            earlier = trees.get(row.seq_id)  # the sequence's previous tree row: the nodes of it this one attends
            if row.tree and earlier is not None and not earlier[0].finished:
                record, j, before = earlier
                record.kept_nodes = tree.kept_nodes(calls[j], before.row, before.rq, call, row.row, row.rq)
            rows.append(tree.row_record(row, group, len(committed[row.seq_id])))
            rows[-1].head_source = head_source(
                calls, index, step.heads, row.row, row.drafts, row.seq_id, rows[-1].committed_before
            )
            if row.cache:  # its cache holds the tokens before the pending one
                # (a cut packed row's keys are its packed row's, shared: not copied per sequence)
                keys = None if call.keys0 is None or call.segments else call.keys0[row.row]
                content.append(ContentCheck(rows[-1], keys, committed[row.seq_id][:-1]))
            if row.tree:
                trees[row.seq_id] = (rows[-1], index, row)
        for i, record in enumerate(rows):
            record.row = i  # its place among the step's rows
            committed[record.write_seq].extend(record.emitted)
            if record.finished:
                running.discard(record.write_seq)
        started = calls[min(proposals, default=index)].started  # the first proposal, else the verify
        steps.append(
            StepRecord(
                step=len(steps),
                batch_id=0,
                cache_len=max(row.cache + row.rq.pending for row in step.rows),
                query_len=max(row.rq.drafts for row in step.rows) + 1,
                grouped=None,
                draft_ms=round(sum(calls[j].ended - calls[j].started for j in proposals) * 1000, 4),
                verify_ms=round((call.ended - call.started) * 1000, 4),
                align_ms=0.0,
                total_ms=round((call.ended - started) * 1000, 4),
                rows=rows,
            )
        )
    pads: dict[int, int] = {}  # what a continuing row's sequence shows at its next step: its padding then
    for step_record in reversed(steps):
        for record in step_record.rows:
            record.left_pad_after = None if record.finished else pads.get(record.seq_id)
            pads[record.seq_id] = record.left_pad
    return steps


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
