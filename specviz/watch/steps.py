"""From captured calls and declared emissions to the trace's step records, read from what the
models were fed, never from a fixed k. Per row of a target call (`calls.read_row`) the query ends
at its last attended slot; its d drafts (0..k, ragged) are its chain of draft calls; the pending
slot is the last attended slot minus d, and the slots before it are context (cached, or re-fed by a
cacheless loop). A target call is a verify step when an emission is attributed to it
(`attribution`); k is the run's largest d. The row credited with an emission is the one its tokens
fit (`credit`), so a write-back to the wrong sequence shows as `write_seq != seq_id`.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

from specviz.trace.schema import RowRecord, StepRecord
from specviz.watch import tree
from specviz.watch.attribution import Emit, Group, attribute
from specviz.watch.calls import (
    CallReader,
    RowQuery,
    attended_ids,
    context_before,
    draft_free_query,
    fed_positions,
    last_slot,
    mask_row,
    row_seq_ids,
    segment_of,
    tree_of,
)
from specviz.watch.credit import accepted_and_bonus, assign_rows, row_tokens
from specviz.watch.endings import budgets, close_by_length, endings
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


def build_steps(
    calls: list[CallRecord], groups: list[Group], prompts: list[list[int]], read: CallReader, draft_free: bool = False
) -> list[StepRecord]:
    """One step record per target call emissions were attributed to. `draft_free`: no draft calls
    ran, so a row's drafts are read after its committed tokens (`draft_free_query`)."""
    by_call: dict[int, list[Group]] = {}
    for group in groups:
        by_call.setdefault(group.call, []).append(group)
    committed = {seq_id: list(ids) for seq_id, ids in enumerate(prompts)}
    running = set(committed)  # the sequences not finished yet
    steps: list[StepRecord] = []
    origins: list[tuple[RowRecord, int, int]] = []  # tree rows: (record, call index, row)
    for index in sorted(by_call):
        call = calls[index]
        shown = [read(index, r) for r in range(call.batch_size)]
        if draft_free:  # each row's drafts at its own pending slot, before any row is credited
            for r, seq_id in enumerate(row_seq_ids(call)):
                if not shown[r].drafts and segment_of(call, r).drafts is None:
                    tokens = committed.get(seq_id, [])  # a row of no known sequence: nothing to read by
                    shown[r] = draft_free_query(call, r, tokens) or shown[r]
        produced = assign_rows(call, by_call[index], shown, running)
        rows, proposals = [], set(_head_calls(calls, index))
        if call.trees:  # a tree's drafts are read from the verify; every draft call since is its proposal
            proposals.update(tree.draft_calls_before(calls, index))
        for r, seq_id in enumerate(row_seq_ids(call)):
            # A row that produced nothing and is no step of its sequence: idle (a finished
            # sequence's row the engine still computes), a prefill chunk said so (KV written, no
            # token), or a newcomer's prefill riding in another's step (vLLM mixes them in).
            if r not in produced and (
                seq_id not in running
                or segment_of(call, r).chunk
                or _prefilling(call, r, committed[seq_id], len(prompts[seq_id]))
            ):
                continue
            proposals.update(j for j, _ in shown[r].chain)
            group = produced.get(r, Group(seq_id, [], None, index, call.started))  # nothing produced
            rows.append(_row_record(calls, index, r, seq_id, shown[r], group, len(committed[seq_id])))
            if tree_of(call, r) is not None:
                origins.append((rows[-1], index, r))
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
                cache_len=max(call.cache_of(r) + rq.pending for r, rq in enumerate(shown)),
                query_len=max(rq.drafts for rq in shown) + 1,
                grouped=None,
                draft_ms=round(sum(calls[j].ended - calls[j].started for j in proposals) * 1000, 4),
                verify_ms=round((call.ended - call.started) * 1000, 4),
                align_ms=0.0,
                total_ms=round((call.ended - started) * 1000, 4),
                rows=rows,
            )
        )
    _fill_left_pad_after(steps)
    _fill_kept_nodes(calls, read, origins)
    return steps


def _fill_kept_nodes(calls: list[CallRecord], read: CallReader, origins: list[tuple[RowRecord, int, int]]) -> None:
    """A tree row's kept nodes: what the sequence's next step still attends of its block."""
    later: dict[int, tuple[int, int]] = {}  # seq -> (call index, row) of its next tree step
    for record, index, r in reversed(origins):
        after = later.get(record.seq_id)
        if after is not None and not record.finished:
            j, r2 = after
            record.kept_nodes = tree.kept_nodes(calls[index], r, read(index, r), calls[j], r2, read(j, r2))
        later[record.seq_id] = (index, r)


def _prefilling(call: CallRecord, row: int, committed: list[int], prompt_len: int) -> bool:
    """A newcomer's prefill (or a chunk of it) riding in the others' step: a sequence not yet
    stepped whose row feeds its prompt's next tokens after the `c` its cache holds, short of the
    prompt's end (a decode feeds the last one), in a call where some row reads a cache."""
    if len(committed) != prompt_len or not any(call.query_flags(row)):
        return False
    if not any(call.cache_of(r) for r in range(call.batch_size)):
        return False  # a re-prefill of the whole batch (or a cacheless loop): every row is read
    fed, c = attended_ids(call, row), call.cache_of(row)
    return c + len(fed) < len(committed) and fed == committed[c : c + len(fed)]


def _head_calls(calls: list[CallRecord], index: int) -> list[int]:
    """A draft head's calls since the target call before this one: the step's proposals (timed)."""
    return [j for j in tree.draft_calls_before(calls, index) if calls[j].drafter]


def _row_record(
    calls: list[CallRecord], index: int, r: int, seq_id: int, rq: RowQuery, group: Group, committed: int
) -> RowRecord:
    """Row `r` of target call `index` read as `rq`, credited with `group` (no tokens: it produced
    nothing), its sequence holding `committed` tokens."""
    call = calls[index]
    drafts, targets = row_tokens(call, r, rq)
    accepted, bonus = accepted_and_bonus(group.tokens, drafts, targets)
    runs, context, causal = mask_row(call, r, rq)
    cache_len = call.cache_of(r) + rq.pending
    lead = runs[0][1] if runs and runs[0][0] == 0 else 0
    shape: dict[str, Any] = {}
    if tree_of(call, r) is not None:  # a tree row (schema 3): its own path and mask reading
        shape = tree.tree_fields(call, r, rq, group.tokens, targets)
        accepted, bonus = shape.pop("accepted"), shape.pop("bonus")
        read = tree.mask_row(call, r, rq)
        if read is not None:
            runs, context = read
        causal = None
    return RowRecord(
        row=r,
        seq_id=seq_id,
        committed_before=committed,
        left_pad=min(lead, cache_len),
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
        head_source=head_source(calls, index, _head_calls(calls, index), r, drafts, seq_id, committed),
        **_draft_fields(calls, rq.chain, committed),
        **shape,
    )


def _draft_fields(calls: list[CallRecord], chain: tuple[tuple[int, int], ...], committed: int) -> dict[str, Any]:
    """The positions the row's draft calls fed and the context each attended, with the context a
    correct draft attends (None: no chain, or a mask not read)."""
    fields = dict.fromkeys(("draft_position_ids", "draft_kv_lens", "draft_kv_len", "draft_kv_len_expected"))
    contexts = [context_before(calls[j], dr, last_slot(calls[j], dr)) for j, dr in chain]
    if chain:
        fields["draft_position_ids"] = fed_positions(calls, chain)
    if min(contexts, default=-1) >= 0:  # a chain, every mask of it read
        fields.update(draft_kv_lens=contexts, draft_kv_len=contexts[0], draft_kv_len_expected=committed - 1)
    return fields


def _fill_left_pad_after(steps: list[StepRecord]) -> None:
    """A continuing row's padding after the step is its padding at the sequence's next step."""
    later: dict[int, int] = {}
    for step in reversed(steps):
        for row in step.rows:
            row.left_pad_after = None if row.finished else later.get(row.seq_id)
            later[row.seq_id] = row.left_pad


def infer_steps(
    calls: list[CallRecord],
    emits: list[Emit],
    prompts: list[list[int]],
    eos: frozenset[int],
    argmax_is_choice: bool = True,
) -> InferredSteps:
    """Steps and endings from captured calls and declared emits, stopping before the first target
    call no producer could map that a step would be read from (`InferredSteps.unreadable`).
    `argmax_is_choice`: False when the engine samples or processes its logits."""
    for call in calls:
        call.materialize()
        call.argmax_is_choice = argmax_is_choice
    notes: list[str] = []
    end, why = first_unreadable(calls, emits) or (len(calls), None)
    read_calls = calls[:end]
    read_emits = emits if why is None else [e for e in emits if e.after <= end]
    read = CallReader(read_calls)
    draft_free = not any(c.role == "draft" and not c.drafter for c in calls)
    groups = attribute(read_calls, read_emits, prompts, read, notes, draft_free)
    outputs, reasons = endings(groups, emits, prompts, eos)
    own_budgets, max_new = budgets(outputs, reasons)
    # Unread from the cut on: an ending declared after it is not the ending of the last step read.
    ended_unread = {e.seq_id for e in emits[len(read_emits) :]}
    close_by_length([g for g in groups if g.seq_id not in ended_unread], outputs, reasons, max_new)
    steps = build_steps(read_calls, groups, prompts, read, draft_free=draft_free)
    if any(c.drafter for c in read_calls):
        notes.extend(unfound_note(steps))
    k = max((len(row.draft_tokens) for step in steps for row in step.rows), default=0)
    events = [c.started for c in calls] + [e.at for e in emits]
    return InferredSteps(
        steps=steps,
        outputs=outputs,
        finish_reasons=reasons,
        k=k,
        max_new_tokens=max_new,
        notes=notes,
        first_call_at=min((c.started for c in calls), default=None),
        last_event_at=max(events, default=None),
        unreadable=None if why is None else (len(steps), why),
        budgets=own_budgets,
    )


def first_unreadable(calls: list[CallRecord], emits: list[Emit]) -> tuple[int, str] | None:
    """(index, why) of the first unmapped target call an emission follows; None: all were read."""
    targets = [i for i, c in enumerate(calls) if c.role == "target"]
    stepped = {bisect_left(targets, emit.after) - 1 for emit in emits}  # each emit's last target call
    found = min((targets[t] for t in stepped if t >= 0 and calls[targets[t]].unreadable is not None), default=None)
    if found is None:
        return None
    return found, f"target call {found}: {calls[found].unreadable}"
