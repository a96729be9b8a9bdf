"""EQSPEC: static batches kept rectangular by realigning every step (correctness first).

After each verify step every continuing row drops its old left padding and its rejected slots,
keeps its accepted tokens, and is left-padded anew to the batch's new common width; both the
target's and the draft's KV move to their new offsets in one batched gather per layer
(`kv/moves.compact`). Finished rows leave the batch in the same move. Without a draft (k = 0) this
is plain batched greedy decoding with left padding: the throughput baseline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specviz.engine.batch import Batch, SeqState
from specviz.engine.kv.moves import KVMove, compact, compact_per_row_loop, rebuild
from specviz.engine.kv.state import leading_zeros
from specviz.engine.methods.base import Method
from specviz.engine.methods.static import run_static
from specviz.engine.step import Engine, StepOutcome

if TYPE_CHECKING:
    from specviz.engine.config import RunConfig

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


def prefill(engine: Engine, chunk: list[SeqState], batch_id: int) -> Batch:
    """One left-padded batch prefill per model, the target's first (as serving engines run it: a
    draft prefill that reads the target's predictions, chunked, finds them made)."""
    target = engine.prefill(engine.target, chunk)
    draft = engine.prefill(engine.draft, chunk) if engine.draft is not None else None
    return Batch(chunk, target, draft, batch_id)


def run_eqspec(engine: Engine, seqs: list[SeqState], batch_size: int, compact_fn: CompactFn = compact) -> None:
    def apply(batch: Batch, outcome: StepOutcome) -> tuple[Batch, list[int | None]]:
        new_batch = realign(batch, outcome, compact_fn)
        return new_batch, pads_after(batch, outcome, new_batch)

    run_static(engine, seqs, batch_size, prefill, apply)


def run(engine: Engine, seqs: list[SeqState], config: RunConfig) -> dict[str, Any]:
    """The method runner (also the baseline's: k = 0); no header options."""
    run_eqspec(engine, seqs, config.batch_size, compact_per_row_loop if config.per_row_loop_move else compact)
    return {}


METHOD = Method(run)
