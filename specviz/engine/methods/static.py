"""The static-batch loop shared by EQSPEC and INPLACE: chunk, prefill, step until every row ends.

A method supplies two hooks: `prefill` builds a chunk's first batch (its layout, its row order)
and `apply` carries out a step's cache plans, returning the next batch and each old row's left
padding after the move (None for rows that left). The loop owns everything else.
"""

from __future__ import annotations

from collections.abc import Callable

from specviz.engine.batch import Batch, SeqState
from specviz.engine.step import Engine, StepOutcome

Prefill = Callable[[Engine, list[SeqState], int], Batch]  # (engine, chunk, batch_id) -> the chunk's batch
Apply = Callable[[Batch, StepOutcome], tuple[Batch, list[int | None]]]  # -> next batch, left pad after


def run_static(engine: Engine, seqs: list[SeqState], batch_size: int, prefill: Prefill, apply: Apply) -> None:
    """Static batches of `batch_size`, each decoded until every row ends."""
    for batch_id, start in enumerate(range(0, len(seqs), batch_size)):
        batch = prefill(engine, seqs[start : start + batch_size], batch_id)
        previous: list[int] | None = None
        while batch.seqs:
            ids = [s.seq_id for s in batch.seqs]
            batch.regrouped = previous is not None and ids != previous
            previous = ids
            outcome = engine.step(batch)
            next_batch, left_pad_after = apply(batch, outcome)
            engine.finish_step(outcome, left_pad_after)
            batch = next_batch
