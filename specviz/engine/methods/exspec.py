"""EXSPEC: a pool of sequences with their own caches, batched by equal length when possible.

Each sequence keeps its target and draft KV in one row of a persistent pool (`kv/pool.py`) for its
whole life. Every step picks up to B sequences from a sliding window over the unfinished ones and
gathers their rows into a batch (a sequence chosen for the first time is prefilled alone, with no
padding, straight into its batch row: `place_batch.py`); sequences of equal committed length need no padding. When no
such group exists the step falls back to a batch of mixed lengths with left padding (EQSPEC-style).
Before another group is gathered, only the slots the last step wrote are scattered back to the
end of each row; rejected drafts stay past the row's length and are overwritten later, so nothing
is compacted. A group that did not change since the last step (every unfinished sequence fits in
one batch) is rebuilt from the last step's batch instead (`_gather`), with one batched move from
a source as wide as the group, and the pool is not written until the group changes (then its
rows are stored whole).

With `--prefill-chunk N` (and a model the mixed forward can carry: `admission.mixes`), a
sequence enters the pools only once its context is cached, N tokens a step, each chunk riding in
the step's verify forward as an extra row (`mixed.py`); the group is chosen from the ready
sequences (`admission.py`).

Policies:
- `reference`: the paper's: the first length in window order with at least B sequences, else
  fall back to the first B of the window.
- `largest`: the largest equal-length group in the window, used when it fills at least half
  a batch (a smaller unpadded batch beats a padded full one at these sizes); else fall back.
- `converge`: length-aware admission plus shortest-first selection. Equal lengths are rare
  because committed lengths start far apart (prompt lengths differ by hundreds of tokens) and
  drift apart (rows accept different numbers of drafts), so this policy steers them together:
  sequences enter the window in prompt-length order (the window holds similar lengths), and
  the shortest sequences are served first, so laggards catch up while leaders wait and the
  window's lengths stay within a few tokens of each other. Each step takes the first of:
  a full batch of one length (the shortest such length); a group of one length filling at
  least 3/4 of a batch (shortest such); the window's shortest length if it fills half a
  batch; else the B shortest sequences (padded, but from a narrow band, and advancing the
  rows that hold the others back). The thresholds trade a few rows per step for group share
  (benchmarks/grouping_sim.py runs this policy code over SpecBench prompt lengths).
  Scheduling order never changes a sequence's tokens, so output stays exact; short prompts
  finish first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from specviz.engine.batch import Batch, SeqState
from specviz.engine.kv.moves import rebuild
from specviz.engine.kv.placement import Prefill, place_batch, prefills_in_place
from specviz.engine.kv.pool import KVPool
from specviz.engine.kv.state import KVState
from specviz.engine.methods.admission import mixes, riders_for, split_window
from specviz.engine.methods.base import Method
from specviz.engine.methods.grouping import admission_order, select_group
from specviz.engine.mixed import Aboard, Rider, open_rider
from specviz.engine.prefill import chunk_records
from specviz.engine.step import Engine, StepOutcome

if TYPE_CHECKING:
    from specviz.engine.config import RunConfig


def run_exspec(
    engine: Engine,
    seqs: list[SeqState],
    batch_size: int,
    window_size: int,
    policy: str = "largest",
) -> dict[str, Any]:
    if window_size < batch_size:
        raise ValueError(f"exspec window ({window_size}) must be at least the batch size ({batch_size})")
    if not seqs:
        return {"steps": 0, "grouped_steps": 0, "group_share": 0.0}
    # Every admitted sequence keeps one row of each pool until it finishes; the window bounds how
    # many are admitted at once. Rows are as wide as the longest sequence can get.
    rows = min(window_size, len(seqs))
    width = max(len(s.prompt_ids) for s in seqs) + engine.max_new_tokens + engine.k + 1
    target_pool = KVPool(rows, width, engine.device, engine.cache_headroom)
    draft_pool = KVPool(rows, width, engine.device, engine.cache_headroom) if engine.draft is not None else None
    queue = admission_order(seqs, policy)
    steps = grouped_steps = 0
    previous: list[int] | None = None
    held: Held | None = None  # the last step's batch and plans
    mixing = mixes(engine)
    waiting: dict[int, Rider] = {}  # mixed chunked prefill: sequences cached a chunk at a time, not yet admitted
    while True:
        window = [s for s in queue if not s.done][:window_size]
        if not window:
            break
        gather_started = engine.now()
        aboard: Aboard | None = None
        if mixing:
            ready, unready = split_window(window, target_pool.row_of)
            chosen = select_group(ready, batch_size, policy) if ready else []
            aboard = _board(engine, waiting, riders_for(unready, len(chosen), batch_size), target_pool, draft_pool)
            if not chosen:  # nothing to verify yet: the chunks get a forward of their own
                aboard.prefill(engine.target)
                _admit_complete(aboard, waiting, target_pool, draft_pool)
                continue
        else:
            chosen = select_group(window, batch_size, policy)
        board_s = engine.now() - gather_started  # the riders' draft feed: prefill, not alignment
        grouped = len({s.committed for s in chosen}) == 1
        ids = [s.seq_id for s in chosen]
        target, draft, behind, prefill_s = _gather(engine, held, chosen, target_pool, draft_pool)
        prefill_s += board_s
        batch = Batch(chosen, target, draft, batch_id=0, grouped=grouped, riders=aboard or None)
        batch.regrouped = previous is not None and ids != previous
        previous = ids
        taken_widths = (target.width, draft.width if draft is not None else 0)  # the step appends to both
        take_s = engine.now() - gather_started - prefill_s  # prefilling new sequences is no alignment
        outcome = engine.step(batch)
        _release_finished(batch, target_pool, draft_pool)
        held = Held(batch, outcome, taken_widths, behind)
        left_pad_after: list[int | None] = [None] * len(chosen)
        for old_row in outcome.active_rows.tolist():
            left_pad_after[old_row] = 0  # a pool row holds no padding of its own
        engine.finish_step(outcome, left_pad_after, align_before_s=take_s)  # gathering the group is alignment
        if aboard is not None:
            _admit_complete(aboard, waiting, target_pool, draft_pool)
        steps += 1
        grouped_steps += int(grouped)
    return {"steps": steps, "grouped_steps": grouped_steps, "group_share": grouped_steps / max(steps, 1)}


@dataclass
class Held:
    """The last step's batch and plans, not yet stored in the pools.

    `pool_behind`: steps before this one whose slots the pools also lack (the group was carried
    over from batch to batch without storing); 0 means the pools miss only this step's slots.
    """

    batch: Batch
    outcome: StepOutcome
    widths: tuple[int, int]  # target and draft widths as taken (the step appended after them)
    pool_behind: int = 0


def _gather(
    engine: Engine, held: Held | None, chosen: list[SeqState], target_pool: KVPool, draft_pool: KVPool | None
) -> tuple[KVState, KVState | None, int, float]:
    """The group's left-padded batch, in the order of `chosen`, how far the pools are behind, and
    the seconds spent prefilling sequences new to the pools.

    When the last step's batch holds exactly these sequences (a group that did not change, as
    when every unfinished sequence fits in one batch), it is rebuilt from that batch by its own
    plans: one batched KV move from a source as wide as the group, like EQSPEC's realignment,
    instead of a gather from pool rows as wide as the longest sequence ever admitted, and the
    pools are not written (they fall one more step behind). Any other group is gathered from the
    pools, once they hold the last batch's sequences again: the slots its step wrote, or whole
    rows when they fell further behind. A sequence enters the pools when first chosen: it is
    prefilled alone (no padding), straight into its row of the batch (`place_batch.py`).
    """
    ids = [s.seq_id for s in chosen]
    if held is not None:
        row_of = {held.batch.seqs[r].seq_id: r for r in held.outcome.active_rows.tolist()}
        if len(row_of) == len(ids) and all(i in row_of for i in ids):
            rows = torch.tensor([row_of[i] for i in ids], dtype=torch.long, device=held.outcome.active_rows.device)
            target = rebuild(held.batch.target, rows, held.outcome.target_plan)
            draft = None
            if held.batch.draft is not None and held.outcome.draft_plan is not None:
                draft = rebuild(held.batch.draft, rows, held.outcome.draft_plan)
            return target, draft, held.pool_behind + 1, 0.0
        _store(held, target_pool, draft_pool)
    fresh = [s for s in chosen if s.seq_id not in target_pool.row_of]
    prefill = _TimedPrefill(engine, chosen)
    models = [engine.target] + ([engine.draft] if engine.draft is not None else [])
    if fresh and all(prefills_in_place(m) for m in models):
        lengths = {s.seq_id: s.committed - 1 for s in fresh}
        target = place_batch(target_pool, ids, lengths, prefill.into(engine.target))
        draft = place_batch(draft_pool, ids, lengths, prefill.into(engine.draft)) if draft_pool is not None else None
        return target, draft, 1, prefill.seconds  # the pools lack the new rows' slots: store whole rows next
    for seq in fresh:  # a model whose sliding layers HF keeps: its own cache layers, then the pool
        target_pool.admit(seq.seq_id, prefill.alone(engine.target, seq))
        if draft_pool is not None:
            draft_pool.admit(seq.seq_id, prefill.alone(engine.draft, seq))
    draft = draft_pool.take(ids) if draft_pool is not None else None
    return target_pool.take(ids), draft, 0, prefill.seconds


def _board(
    engine: Engine, waiting: dict[int, Rider], seqs: list[SeqState], target_pool: KVPool, draft_pool: KVPool | None
) -> Aboard:
    """The riders of this step: each of `seqs` with its next chunk, its draft already fed it.

    A sequence with nothing to cache (a one-token prompt) is admitted at once, unrecorded, as a
    whole prefill of it would leave it. The draft is fed before the target's forward: a boundary's
    faulty feed reads the target's choice after the previous chunk, known since the last step."""
    aboard = Aboard([], engine.config.pad_id, engine.device, engine.fault)
    for seq in seqs:
        rider = waiting.get(seq.seq_id)
        if rider is None:
            with_draft = engine.draft is not None
            (record,) = chunk_records(engine, [seq], draft=with_draft)
            rider = open_rider(seq, record, engine.device, with_draft)
        if not rider.context:
            engine.context.prefills.pop(seq.seq_id, None)
            _admit(rider, target_pool, draft_pool)
            continue
        waiting[seq.seq_id] = rider
        aboard.riders.append(rider)
    aboard.next_chunks(engine.config.prefill_chunk)
    aboard.feed_draft(engine.draft)
    return aboard


def _admit_complete(aboard: Aboard, waiting: dict[int, Rider], target_pool: KVPool, draft_pool: KVPool | None) -> None:
    """Riders whose whole context is cached enter the pools: they are ready for the next group."""
    for rider in aboard.riders:
        if rider.complete:
            del waiting[rider.seq.seq_id]
            _admit(rider, target_pool, draft_pool)


def _admit(rider: Rider, target_pool: KVPool, draft_pool: KVPool | None) -> None:
    target_pool.admit(rider.seq.seq_id, rider.target)
    if draft_pool is not None and rider.draft is not None:
        draft_pool.admit(rider.seq.seq_id, rider.draft)


class _TimedPrefill:
    """Prefills of single sequences, timed so the step's alignment time leaves them out."""

    def __init__(self, engine: Engine, chosen: list[SeqState]) -> None:
        self.engine, self.chosen, self.seconds = engine, chosen, 0.0

    def alone(self, model: Any, seq: SeqState, cache: Any | None = None) -> KVState:
        started = self.engine.now()
        state = self.engine.prefill(model, [seq], cache)
        self.seconds += self.engine.now() - started
        return state

    def into(self, model: Any) -> Prefill:
        """prefill(batch row, cache): the row's sequence, prefilled into `cache`."""
        return lambda row, cache: self.alone(model, self.chosen[row], cache)


def _store(held: Held, target_pool: KVPool, draft_pool: KVPool | None) -> None:
    """Bring the continuing rows of the held batch up to date in their pool rows."""
    batch, outcome = held.batch, held.outcome
    rows = outcome.active_rows
    ids = [batch.seqs[r].seq_id for r in rows.tolist()]
    if not ids:
        return
    whole = held.pool_behind > 0
    target_pool.store_step(ids, batch.target, held.widths[0], rows, outcome.target_plan, whole_rows=whole)
    if draft_pool is not None and batch.draft is not None and outcome.draft_plan is not None:
        draft_pool.store_step(ids, batch.draft, held.widths[1], rows, outcome.draft_plan, whole_rows=whole)


def _release_finished(batch: Batch, target_pool: KVPool, draft_pool: KVPool | None) -> None:
    """Free the pool rows of the sequences that finished in this step."""
    for seq in batch.seqs:
        if seq.done:
            target_pool.release(seq.seq_id)
            if draft_pool is not None:
                draft_pool.release(seq.seq_id)


def run(engine: Engine, seqs: list[SeqState], config: RunConfig) -> dict[str, Any]:
    """The method runner; returns the group stats for the header options."""
    return run_exspec(engine, seqs, config.batch_size, config.window, config.exspec_policy)


def options(config: RunConfig) -> dict[str, Any]:
    """Header options known before the run: the window and the policy."""
    return {"exspec_window": config.window, "exspec_policy": config.exspec_policy}


METHOD = Method(run, options=options)
