"""EQSPEC: static batches kept rectangular by realigning every step (correctness first).

After each verify step every continuing row drops its old left padding and its rejected slots,
keeps its accepted tokens, and is left-padded anew to the batch's new common width; both the
target's and the draft's KV move to their new offsets in one batched gather per layer
(`kv.compact`). Finished rows leave the batch in the same move. Without a draft (k = 0) this
is plain batched greedy decoding with left padding: the throughput baseline.
"""

from __future__ import annotations

from specviz.engine.kv.moves import KVMove, compact, rebuild
from specviz.engine.kv.state import leading_zeros
from specviz.engine.step import Batch, Engine, SeqState, StepOutcome

CompactFn = KVMove  # compact, or the reference per-row loop (benchmarks)


def realign(batch: Batch, outcome: StepOutcome, compact_fn: CompactFn = compact) -> Batch:
    rows = outcome.active_rows
    target = rebuild(batch.target, rows, outcome.target_plan, compact_fn)
    draft = None
    if batch.draft is not None and outcome.draft_plan is not None:
        draft = rebuild(batch.draft, rows, outcome.draft_plan, compact_fn)
    seqs = [batch.seqs[r] for r in rows.tolist()]
    return Batch(seqs=seqs, target=target, draft=draft, batch_id=batch.batch_id)


def pads_after(batch: Batch, outcome: StepOutcome, new_batch: Batch) -> list[int | None]:
    """Left padding each old row has after realignment (None for rows that left)."""
    after: list[int | None] = [None] * len(batch.seqs)
    pads = leading_zeros(new_batch.target.mask).tolist()
    for new_row, old_row in enumerate(outcome.active_rows.tolist()):
        after[old_row] = pads[new_row]
    return after


def run_eqspec(engine: Engine, seqs: list[SeqState], batch_size: int, compact_fn: CompactFn = compact) -> None:
    for batch_id, start in enumerate(range(0, len(seqs), batch_size)):
        chunk = seqs[start : start + batch_size]
        draft_state = engine.prefill(engine.draft, chunk) if engine.draft is not None else None
        batch = Batch(chunk, engine.prefill(engine.target, chunk), draft_state, batch_id)
        previous: list[int] | None = None
        while batch.seqs:
            ids = [s.seq_id for s in batch.seqs]
            batch.regrouped = previous is not None and ids != previous
            previous = ids
            outcome = engine.step(batch)
            align_started = engine.now()
            new_batch = realign(batch, outcome, compact_fn)
            engine.finish_step(outcome, pads_after(batch, outcome, new_batch), align_started)
            batch = new_batch
