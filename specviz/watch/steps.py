"""From captured calls and declared emissions to the trace's step records.

The step structure is inferred from what the models were fed, never from a fixed k:
- per row of a target call, the *query* is read from the mask: its last attended slot ends the
  row's proposal (padding on either side, and prefills that also emit, read alike);
- the row's draft length d (0..k, ragged within a step) is its *proposal chain*: walking back over
  draft calls, draft call j from the end must output the row's j-th attended query token from the
  end and be fed the one before it (its last attended slot). Draft rows are matched by declared
  draft rows, else by the same index, else by any row whose tokens fit (a draft batch that holds
  other rows than the target's). Target calls of other rows (re-prefills) do not end the walk;
- the pending slot is the last attended slot minus d; the slots before it are context (cached or
  re-fed: a cacheless loop re-feeds everything, and is judged on what each call attends);
- a target call is a verify step when an emission is attributed to it (`attribution`): the latest target call
  before the `emit` whose row for that sequence fed the sequence's pending token at its pending
  slot. Matching on the pending token, not on time alone, keeps engines that report tokens one
  call late (HF `generate` with deferred stop checks) attributed right;
- k is the run's largest d; the row that produced an emission is the sequence's own row when the
  tokens are consistent with its drafts and argmaxes, else the row they are consistent with: so a
  write-back to the wrong sequence shows up as `write_seq != seq_id`, as it happened;
- a row whose sequence has finished and that receives nothing is idle (engines that keep
  finished rows in the batch): it is left out.
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
    argmax_at,
    attended_ids,
    context_before,
    declared_drafts,
    draft_free_query,
    fed_positions,
    is_chunk,
    last_slot,
    mask_row,
    row_seq_ids,
)
from specviz.watch.headinput import head_source, unfound_note
from specviz.watch.hooks import CallRecord


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


# ----------------------------------------------------------------------------- rows


def consistent(tokens: list[int], drafts: list[int], targets: list[int], free_last: bool = False) -> bool:
    """Tokens read as some drafts, then (optionally) one more: the target's own token at that slot,
    or any token when the argmax is not the engine's choice (`free_last`: a sample, or a choice
    made on processed logits)."""
    for i, token in enumerate(tokens):
        if i < len(drafts) and token == drafts[i]:
            continue
        return i == len(tokens) - 1 and (free_last or (i < len(targets) and token == targets[i]))
    return True


def matched_prefix(drafts: list[int], targets: list[int]) -> int | None:
    if len(targets) != len(drafts) + 1:
        return None
    n = 0
    while n < len(drafts) and drafts[n] == targets[n]:
        n += 1
    return n


def accepted_and_bonus(tokens: list[int], drafts: list[int], targets: list[int]) -> tuple[int, int | None]:
    """(accepted, bonus) as the emitted tokens show them.

    Tokens that are a prefix of the greedy-correct proposal accept what verification allowed
    (emitting fewer is speed left on the table, not a wrong answer). Otherwise the engine accepted
    the drafts it emitted.
    """
    matched = matched_prefix(drafts, targets)
    if matched is not None and tokens == (drafts[:matched] + [targets[matched]])[: len(tokens)]:
        accepted = matched
    else:
        accepted = 0
        while accepted < min(len(tokens), len(drafts)) and tokens[accepted] == drafts[accepted]:
            accepted += 1
    bonus = None
    if len(tokens) == accepted + 1:
        bonus = tokens[accepted]
    return accepted, bonus


def assign_rows(
    call: CallRecord, groups: list[Group], shown: list[RowQuery], finished: set[int], known: set[int]
) -> dict[int, Group]:
    """Which row produced each group: its own row if consistent, else the row it is consistent with
    (each row read as `shown`: with its drafts, wherever they were read from)."""
    rows = row_seq_ids(call)
    free_last = not call.argmax_is_choice

    def fits(group: Group, r: int) -> bool:
        drafts, targets = row_tokens(call, r, shown[r])
        if call.trees and call.trees[r] is not None:  # a path of the row's tree, then its choice there
            nodes = [call.input_ids[r][shown[r].pending], *drafts]
            return tree.consistent(group.tokens, call.trees[r], nodes, targets, free_last)
        return consistent(group.tokens, drafts, targets, free_last)

    taken: dict[int, Group] = {}

    def live() -> list[int]:
        return [r for r in range(len(rows)) if r not in taken and rows[r] in known and rows[r] not in finished]

    def place(group: Group) -> bool:
        own = rows.index(group.seq_id)
        if own not in taken and fits(group, own):
            taken[own] = group
            return True
        return False

    # A late group (emitted after a newer call of its sequence: maybe that call's tokens, matched
    # here by its pending token) places after the on-time groups have been read, split included.
    pending_groups = [g for g in groups if g.late or not place(g)]
    pending_groups = [g for g in pending_groups if not g.late] + [g for g in pending_groups if g.late]
    unfit = []
    for group in pending_groups:
        if group.late and place(group):
            continue
        others = [r for r in live() if fits(group, r)]
        if others:
            taken[others[0]] = group
            continue
        pieces = _split_to_rows(group, live(), rows.index(group.seq_id), fits)
        if pieces is None:
            unfit.append(group)
        for row, piece in pieces or []:
            taken[row] = piece
    for group in unfit:  # fits no row, whole or split: its own row shows what it got
        own = rows.index(group.seq_id)
        if own not in taken:
            taken[own] = group
    return taken


def _split_to_rows(group: Group, free: list[int], own: int, fits: Any) -> list[tuple[int, Group]] | None:
    """A sequence that got several emits in one step, fitting no single row: the emits split into
    consecutive pieces that each fit a distinct free row (its own row preferred), e.g. one row's
    tokens written to another row's sequence before that row's own. None when no split fits."""
    if not group.cuts:
        return None
    bounds = [0, *group.cuts, len(group.tokens)]

    def piece(a: int, b: int) -> Group:
        return Group(group.seq_id, group.tokens[bounds[a] : bounds[b]], None, group.call, group.at)

    def search(a: int, free_rows: list[int]) -> list[tuple[int, Group]] | None:
        if a == len(bounds) - 1:
            return []
        for b in range(len(bounds) - 1, a, -1):  # the longest piece first
            candidate = piece(a, b)
            for r in sorted(free_rows, key=lambda r: r != own):
                if fits(candidate, r):
                    rest = search(b, [x for x in free_rows if x != r])
                    if rest is not None:
                        return [(r, candidate), *rest]
        return None

    found = search(0, free)
    if found:
        found[-1][1].finish_reason = group.finish_reason
    return found


def row_tokens(call: CallRecord, row: int, rq: RowQuery) -> tuple[list[int], list[int]]:
    """(the row's d drafts, the target's argmax at its d + 1 query slots, or [] if not kept)."""
    drafts = list(call.input_ids[row][rq.pending + 1 : rq.pending + 1 + rq.drafts])
    targets = [argmax_at(call, row, rq.pending + i) for i in range(rq.drafts + 1)]
    return drafts, ([] if None in targets else targets)


# ----------------------------------------------------------------------------- steps


@dataclass
class _SeqProgress:
    committed: list[int]
    finished: bool = False


def build_steps(
    calls: list[CallRecord], groups: list[Group], prompts: list[list[int]], read: CallReader, draft_free: bool = False
) -> list[StepRecord]:
    """One step record per target call that emissions were attributed to. `draft_free`: the run
    has no draft calls, so a row's drafts are read from its committed tokens (`draft_free_query`)."""
    by_call: dict[int, list[Group]] = {}
    for group in groups:
        by_call.setdefault(group.call, []).append(group)
    progress = {seq_id: _SeqProgress(list(ids)) for seq_id, ids in enumerate(prompts)}
    steps: list[StepRecord] = []
    origins: list[tuple[RowRecord, int, int]] = []  # tree rows: (record, call index, row)
    for index in sorted(by_call):
        call = calls[index]
        finished = {s for s, p in progress.items() if p.finished}
        shown = [read(index, r) for r in range(call.batch_size)]
        if draft_free:  # each row's drafts at its own pending slot, before any row is credited
            for r, seq_id in enumerate(row_seq_ids(call)):
                if not shown[r].drafts and seq_id in progress and declared_drafts(call, r) is None:
                    shown[r] = draft_free_query(call, r, progress[seq_id].committed) or shown[r]
        produced = assign_rows(call, by_call[index], shown, finished, set(progress))
        rows, proposals = [], set(_head_calls(calls, index))
        if call.trees:  # a tree's drafts are read from the verify; every draft call since is its proposal
            proposals.update(tree.draft_calls_before(calls, index))
        for r, seq_id in enumerate(row_seq_ids(call)):
            if r not in produced and (seq_id not in progress or progress[seq_id].finished):
                continue  # idle: a finished sequence's row the engine still computes
            if r not in produced and is_chunk(call, r):
                continue  # a prefill chunk, said so: KV written, no token, no step of its sequence
            if r not in produced and _prefilling(call, r, progress[seq_id].committed, len(prompts[seq_id])):
                continue  # a newcomer's prefill riding in another's step (vLLM mixes them in)
            rq = shown[r]
            proposals.update(j for j, _ in rq.chain)
            rows.append(_row_record(calls, index, r, seq_id, rq, produced.get(r), progress))
            if call.trees and call.trees[r] is not None:
                origins.append((rows[-1], index, r))
        for row in rows:
            target = progress[row.write_seq]
            target.committed.extend(row.emitted)
            if row.finish_reason is not None:
                target.finished = True
        started = calls[min(proposals)].started if proposals else call.started
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
                rows=[_renumber(row, i) for i, row in enumerate(rows)],
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
    """A sequence not yet stepped whose row feeds the next part of its prompt short of its end
    (after the `c` prompt tokens its cache holds), in a call where some row decodes from a cache:
    a newcomer's prefill, or a chunk of it, riding in the others' step, not a step of it (a
    decode feeds the prompt's last token). A re-prefill of the whole batch is read row by row,
    where its bugs show."""
    if len(committed) != prompt_len or not any(call.query_flags(row)):
        return False
    if not any(call.cache_of(r) for r in range(call.batch_size)):
        return False  # a re-prefill of the whole batch (or a cacheless loop): every row is read
    fed, c = attended_ids(call, row), call.cache_of(row)
    return c + len(fed) < len(committed) and fed == committed[c : c + len(fed)]


def _head_calls(calls: list[CallRecord], index: int) -> list[int]:
    """A draft head's calls since the target call before this one: the step's proposals (timed)."""
    found = []
    for j in range(index - 1, -1, -1):
        if calls[j].role == "target":
            break
        if calls[j].drafter:
            found.append(j)
    return found


def _renumber(row: RowRecord, index: int) -> RowRecord:
    row.row = index
    return row


def _row_record(
    calls: list[CallRecord],
    index: int,
    r: int,
    seq_id: int,
    rq: RowQuery,
    group: Group | None,
    progress: dict[int, _SeqProgress],
) -> RowRecord:
    call = calls[index]
    committed = len(progress[seq_id].committed)
    drafts, targets = row_tokens(call, r, rq)
    tokens = group.tokens if group is not None else []
    accepted, bonus = accepted_and_bonus(tokens, drafts, targets)
    runs, context, causal = mask_row(call, r, rq)
    cache_len = call.cache_of(r) + rq.pending
    lead = runs[0][1] if runs and runs[0][0] == 0 else 0
    draft_positions = draft_context = None
    if rq.chain:
        draft_positions = fed_positions(calls, rq.chain)
        draft_context = [context_before(calls[j], dr, last_slot(calls[j], dr)) for j, dr in rq.chain]
        if min(draft_context) < 0:
            draft_context = None  # a mask the hooks could not read
    reason = group.finish_reason if group is not None else None
    shape: dict[str, Any] = {}
    if call.trees and call.trees[r] is not None:  # a tree row (schema 3): its own path and mask reading
        shape = tree.tree_fields(call, r, rq, tokens, targets)
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
        emitted=list(tokens),
        write_seq=group.seq_id if group is not None else seq_id,
        position_ids=list(call.positions[r][rq.pending : rq.pending + rq.drafts + 1]),
        mask_rle=runs,
        kv_len=max(context, 0),
        kv_len_expected=committed - 1,
        draft_kv_len=draft_context[0] if draft_context else None,
        draft_kv_len_expected=committed - 1 if draft_context else None,
        finished=reason is not None,
        finish_reason=reason,
        query_causal=causal,
        draft_position_ids=draft_positions,
        draft_kv_lens=draft_context,
        head_source=head_source(calls, index, _head_calls(calls, index), r, drafts, seq_id, committed),
        **shape,
    )


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
    """The whole inference, from captured calls and declared emits to steps and endings.
    `argmax_is_choice`: False when the engine samples or processes its logits, so no argmax is
    taken for what it chose. Steps stop before the first target call that no producer could map
    and that a step would be read from (`InferredSteps.unreadable`)."""
    for call in calls:
        call.materialize()
        call.argmax_is_choice = argmax_is_choice
    notes: list[str] = []
    cut = first_unreadable(calls, emits)
    read_calls = calls if cut is None else calls[: cut[0]]
    read_emits = emits if cut is None else [e for e in emits if e.after <= cut[0]]
    read = CallReader(read_calls)
    draft_free = not any(c.role == "draft" and not c.drafter for c in calls)
    groups = attribute(read_calls, read_emits, prompts, read, notes, draft_free)
    outputs, reasons = _endings(groups, emits, prompts, eos)
    max_new = _budget(outputs, reasons)
    budgets = {s: len(outputs[s]) for s, reason in reasons.items() if reason == "length"}
    # Unread from the cut on: an ending declared after it is not the ending of the last step read.
    ended_unread = {e.seq_id for e in emits[len(read_emits) :]} if cut is not None else set()
    _close_by_length([g for g in groups if g.seq_id not in ended_unread], outputs, reasons, max_new)
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
        unreadable=None if cut is None else (len(steps), cut[1]),
        budgets=budgets,
    )


def first_unreadable(calls: list[CallRecord], emits: list[Emit]) -> tuple[int, str] | None:
    """(index, why) of the first target call that no producer could map and that an emission
    follows (the call a step would be read from); None when every such call was read."""
    targets = [i for i, c in enumerate(calls) if c.role == "target"]
    found = None
    for emit in emits:
        before = targets[: bisect_left(targets, emit.after)]
        if before and calls[before[-1]].unreadable is not None:
            j = before[-1]
            found = j if found is None else min(found, j)
    if found is None:
        return None
    return found, f"target call {found}: {calls[found].unreadable}"


def _endings(
    groups: list[Group], emits: list[Emit], prompts: list[list[int]], eos: frozenset[int]
) -> tuple[dict[int, list[int]], dict[int, str | None]]:
    """Outputs as emitted (the engine's word), and endings: declared, or an emitted EOS."""
    outputs: dict[int, list[int]] = {seq_id: [] for seq_id in range(len(prompts))}
    reasons: dict[int, str | None] = {seq_id: None for seq_id in range(len(prompts))}
    for emit in emits:
        outputs[emit.seq_id].extend(emit.tokens)
        reasons[emit.seq_id] = emit.finish_reason or reasons[emit.seq_id]
    for group in groups:
        if group.finish_reason is None and any(t in eos for t in group.tokens):
            group.finish_reason = "eos"
            reasons[group.seq_id] = reasons[group.seq_id] or "eos"
    for seq_id, tokens in outputs.items():
        if reasons[seq_id] is None and any(t in eos for t in tokens):
            reasons[seq_id] = "eos"
    return outputs, reasons


def _budget(outputs: dict[int, list[int]], reasons: dict[int, str | None]) -> int:
    """max_new_tokens is not declared: the length at which sequences ended by length, else the longest."""
    by_length = [len(outputs[s]) for s, reason in reasons.items() if reason == "length"]
    return max(by_length) if by_length else max((len(o) for o in outputs.values()), default=0)


def _close_by_length(
    groups: list[Group], outputs: dict[int, list[int]], reasons: dict[int, str | None], max_new: int
) -> None:
    """A sequence that reached the budget without a declared ending ended by length."""
    last: dict[int, Group] = {}
    for group in groups:
        last[group.seq_id] = group
    for seq_id, tokens in outputs.items():
        if reasons[seq_id] is None and max_new and len(tokens) >= max_new:
            reasons[seq_id] = "length"
        group = last.get(seq_id)
        if group is not None and reasons[seq_id] is not None and group.finish_reason is None:
            group.finish_reason = reasons[seq_id]
