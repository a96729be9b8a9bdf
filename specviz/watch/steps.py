"""From captured calls and declared emissions to the trace's step records.

The step structure is inferred, never declared:
- k (drafts per step) is the usual length of the *proposal chain* before a target call: walking
  back over draft calls of the same batch size, draft call j from the end must output the verify
  query's j-th token from the end and be fed the token before it. The chain's calls are the
  step's proposals, whatever else the draft ran (prefills, catch-ups);
- a target call is a verify step when an emission is attributed to it: the latest target call
  before the `emit` whose row for that sequence fed the sequence's pending token at the pending
  slot (`q - 1 - k`). Matching on the pending token, not on time alone, keeps engines that
  report tokens one call late (HF `generate` with deferred stop checks) attributed right;
- in a verify call, query slots before the pending slot are context (a prefill that also
  produces the first token): they count as cache slots, so every step has k + 1 query slots;
- the row that produced an emission is the sequence's own row when the tokens are consistent with
  its drafts and argmaxes, else the row they are consistent with: so a write-back to the wrong
  sequence shows up as `write_seq != seq_id`, as it happened;
- a row whose sequence has finished and that receives nothing is idle (engines that keep
  finished rows in the batch): it is left out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from specviz.trace.schema import RowRecord, StepRecord
from specviz.watch.hooks import CallRecord


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


def row_seq_ids(call: CallRecord) -> tuple[int, ...]:
    """The sequence each row of the call held (the default order when the engine declared none)."""
    return call.rows if call.rows is not None else tuple(range(call.batch_size))


# ----------------------------------------------------------------------------- proposal chains


def proposal_chain(calls: list[CallRecord], index: int) -> list[int]:
    """Indices of the draft calls that proposed the query of target call `index`, in order."""
    verify = calls[index]
    q = verify.query_len
    chain: list[int] = []
    for j in range(index - 1, -1, -1):
        call = calls[j]
        if call.role == "target":
            break
        if call.batch_size != verify.batch_size or call.argmax is None:
            continue
        depth = len(chain) + 1  # this call must output query token q - depth, fed q - depth - 1
        if q - depth - 1 >= 0 and _feeds_and_outputs(call, verify, q - depth):
            chain.append(j)
        elif chain:
            break
        # else: a draft call after the proposals (feeding d_k to fill its cache): skip it
    return chain[::-1]


def _feeds_and_outputs(call: CallRecord, verify: CallRecord, slot: int) -> bool:
    for r, ids in enumerate(verify.input_ids):
        if call.argmax[r][-1] != ids[slot] or call.input_ids[r][-1] != ids[slot - 1]:
            return False
    return True


def infer_k(calls: list[CallRecord], chains: dict[int, list[int]]) -> int:
    lengths = Counter(len(chain) for chain in chains.values() if chain)
    return lengths.most_common(1)[0][0] if lengths else 0


# ----------------------------------------------------------------------------- attribution


def attribute(
    calls: list[CallRecord], emits: list[Emit], prompts: list[list[int]], k: int, notes: list[str]
) -> list[Group]:
    """Each emission to the target call whose row fed that sequence's pending token."""
    history = {seq_id: list(ids) for seq_id, ids in enumerate(prompts)}
    targets = [i for i, c in enumerate(calls) if c.role == "target"]
    last_group: dict[int, Group] = {}
    groups: list[Group] = []
    for emit in emits:
        seq = emit.seq_id
        featuring = [i for i in targets if i < emit.after and seq in row_seq_ids(calls[i])]
        previous = last_group.get(seq)
        newest = featuring[-1] if featuring else None
        if previous is not None and (not emit.tokens or newest is None or newest <= previous.call):
            # More tokens (or only the ending) for a step already attributed.
            previous.tokens.extend(emit.tokens)
            previous.finish_reason = emit.finish_reason or previous.finish_reason
            history[seq].extend(emit.tokens)
            continue
        floor = previous.call if previous is not None else -1
        call = _pending_match(calls, featuring, floor, seq, history[seq][-1], k)
        if call is None:
            notes.append(f"emit for sequence {seq} matches no target call that fed its pending token; not a step")
            history[seq].extend(emit.tokens)
            continue
        group = Group(seq, list(emit.tokens), emit.finish_reason, call, emit.at)
        groups.append(group)
        last_group[seq] = group
        history[seq].extend(emit.tokens)
    return groups


def _pending_match(
    calls: list[CallRecord], featuring: list[int], floor: int, seq: int, pending: int, k: int
) -> int | None:
    fallback = None
    for i in reversed(featuring):
        if i <= floor:
            break
        call = calls[i]
        slot = call.query_len - 1 - k
        if slot < 0:
            continue
        fallback = i if fallback is None else fallback
        if call.input_ids[row_seq_ids(call).index(seq)][slot] == pending:
            return i
    return fallback


# ----------------------------------------------------------------------------- rows


def consistent(tokens: list[int], drafts: list[int], targets: list[int]) -> bool:
    """Tokens read as some drafts, then (optionally) the target's own token at that slot."""
    for i, token in enumerate(tokens):
        if i < len(drafts) and token == drafts[i]:
            continue
        return i == len(tokens) - 1 and i < len(targets) and token == targets[i]
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
    call: CallRecord, groups: list[Group], slot: int, finished: set[int], known: set[int]
) -> dict[int, Group]:
    """Which row produced each group: its own row if consistent, else the row it is consistent with."""
    rows = row_seq_ids(call)
    taken: dict[int, Group] = {}
    pending_groups = []
    for group in groups:
        own = rows.index(group.seq_id)
        if own not in taken and consistent(group.tokens, *_row_tokens(call, own, slot)):
            taken[own] = group
        else:
            pending_groups.append(group)
    for group in pending_groups:
        own = rows.index(group.seq_id)
        live = [r for r in range(len(rows)) if r not in taken and rows[r] in known and rows[r] not in finished]
        others = [r for r in live if consistent(group.tokens, *_row_tokens(call, r, slot))]
        row = others[0] if others else (own if own not in taken else None)
        if row is not None:
            taken[row] = group
    return taken


def _row_tokens(call: CallRecord, row: int, slot: int) -> tuple[list[int], list[int]]:
    drafts = call.input_ids[row][slot + 1 :]
    q = call.query_len
    argmax = call.argmax[row] if call.argmax is not None else []
    wanted = q - slot
    targets = argmax[-wanted:] if len(argmax) >= wanted else []
    return drafts, targets


# ----------------------------------------------------------------------------- masks


def mask_row(call: CallRecord, row: int, slot: int) -> tuple[list[list[int]], int, bool | None]:
    """(mask_rle, attended context slots of the pending token, query block causal or None)."""
    cache_len = call.cache_width + slot
    q = call.query_len - slot
    if call.mask_kind == "none":
        return [[1, cache_len + q]], cache_len, None
    if call.mask_kind == "2d":
        values = call.mask[row]
        return _rle(values), sum(values[:cache_len]), None
    if call.mask_kind == "4d":
        return _mask4_row(call.mask[row], call.cache_width, call.query_len, slot)
    return [], -1, None


def _mask4_row(block: list[list[bool]], width: int, q: int, slot: int) -> tuple[list[list[int]], int, bool | None]:
    """The pending query's view of the cache, then the diagonal; causal if every later query
    slot sees that same context plus exactly the query slots up to itself."""
    tail = len(block)
    first = tail - (q - slot)  # index of the pending slot's row inside the kept tail
    if first < 0:
        return [], -1, None
    context_len = width + slot
    view = [int(v) for v in block[first][:context_len]]
    diagonal = [int(block[first + i][context_len + i]) for i in range(q - slot)]
    causal = True
    for i in range(q - slot):
        line = block[first + i]
        if [int(v) for v in line[:context_len]] != view:
            causal = False
        query_part = [int(v) for v in line[context_len : context_len + q - slot]]
        if query_part[: i + 1] != [1] * (i + 1) or any(query_part[i + 1 :]):
            causal = False
    return _rle(view + diagonal), sum(view), causal


def _rle(values: list[int]) -> list[list[int]]:
    """[0, 0, 1, 1, 1] -> [[0, 2], [1, 3]], canonical like the recorder's."""
    runs: list[list[int]] = []
    for value in values:
        value = int(value)
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return runs


# ----------------------------------------------------------------------------- steps


@dataclass
class _SeqProgress:
    committed: list[int]
    finished: bool = False


def build_steps(
    calls: list[CallRecord],
    groups: list[Group],
    chains: dict[int, list[int]],
    prompts: list[list[int]],
    k: int,
) -> list[StepRecord]:
    by_call: dict[int, list[Group]] = {}
    for group in groups:
        by_call.setdefault(group.call, []).append(group)
    progress = {seq_id: _SeqProgress(list(ids)) for seq_id, ids in enumerate(prompts)}
    steps: list[StepRecord] = []
    for index in sorted(by_call):
        call = calls[index]
        slot = call.query_len - 1 - k
        finished = {s for s, p in progress.items() if p.finished}
        produced = assign_rows(call, by_call[index], slot, finished, set(progress))
        chain = chains.get(index, []) if len(chains.get(index, [])) == k else []
        rows = []
        for r, seq_id in enumerate(row_seq_ids(call)):
            if r not in produced and (seq_id not in progress or progress[seq_id].finished):
                continue  # idle: a finished sequence's row the engine still computes
            rows.append(_row_record(call, r, seq_id, slot, produced.get(r), progress, calls, chain))
        for row in rows:
            target = progress[row.write_seq]
            target.committed.extend(row.emitted)
            if row.finish_reason is not None:
                target.finished = True
        started = calls[chain[0]].started if chain else call.started
        steps.append(
            StepRecord(
                step=len(steps),
                batch_id=0,
                cache_len=call.cache_width + slot,
                query_len=k + 1,
                grouped=None,
                draft_ms=round(sum(calls[j].ended - calls[j].started for j in chain) * 1000, 4),
                verify_ms=round((call.ended - call.started) * 1000, 4),
                align_ms=0.0,
                total_ms=round((call.ended - started) * 1000, 4),
                rows=[_renumber(row, i) for i, row in enumerate(rows)],
            )
        )
    _fill_left_pad_after(steps)
    return steps


def _renumber(row: RowRecord, index: int) -> RowRecord:
    row.row = index
    return row


def _row_record(
    call: CallRecord,
    r: int,
    seq_id: int,
    slot: int,
    group: Group | None,
    progress: dict[int, _SeqProgress],
    calls: list[CallRecord],
    chain: list[int],
) -> RowRecord:
    committed = len(progress[seq_id].committed)
    drafts, targets = _row_tokens(call, r, slot)
    tokens = group.tokens if group is not None else []
    accepted, bonus = accepted_and_bonus(tokens, drafts, targets)
    runs, context, causal = mask_row(call, r, slot)
    cache_len = call.cache_width + slot
    lead = runs[0][1] if runs and runs[0][0] == 0 else 0
    draft_positions = [calls[j].positions[r][-1] for j in chain] if chain else None
    draft_context = [calls[j].context_last[r] for j in chain] if chain else None
    if draft_context is not None and min(draft_context) < 0:
        draft_context = None  # a mask the hooks could not read
    reason = group.finish_reason if group is not None else None
    return RowRecord(
        row=r,
        seq_id=seq_id,
        committed_before=committed,
        left_pad=min(lead, cache_len),
        left_pad_after=None,
        pending_token=call.input_ids[r][slot],
        draft_tokens=drafts,
        target_tokens=targets,
        accepted=accepted,
        bonus=bonus,
        emitted=list(tokens),
        write_seq=group.seq_id if group is not None else seq_id,
        position_ids=call.positions[r][slot:],
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
    )


def _fill_left_pad_after(steps: list[StepRecord]) -> None:
    """A continuing row's padding after the step is its padding at the sequence's next step."""
    later: dict[int, int] = {}
    for step in reversed(steps):
        for row in step.rows:
            row.left_pad_after = None if row.finished else later.get(row.seq_id)
            later[row.seq_id] = row.left_pad


def infer_steps(
    calls: list[CallRecord], emits: list[Emit], prompts: list[list[int]], eos: frozenset[int]
) -> InferredSteps:
    """The whole inference, from captured calls and declared emits to steps and endings."""
    for call in calls:
        call.materialize()
    chains = {i: proposal_chain(calls, i) for i, c in enumerate(calls) if c.role == "target"}
    k = infer_k(calls, chains)
    notes: list[str] = []
    groups = attribute(calls, emits, prompts, k, notes)
    outputs, reasons = _endings(groups, emits, prompts, eos)
    max_new = _budget(outputs, reasons)
    _close_by_length(groups, outputs, reasons, max_new)
    steps = build_steps(calls, groups, chains, prompts, k)
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
    )


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
