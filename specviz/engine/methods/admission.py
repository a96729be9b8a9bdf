"""EXSPEC's admission with mixed chunked prefill: which window sequences may run, which get a chunk.

With `--prefill-chunk N` on EXSPEC (and a model the mixed forward can carry: `mixes`), a sequence
enters the pools only once its whole context is cached. Until then it *waits*: each step, the
first waiting sequences in window order (the admission order the policy chose) get their next
chunk as riders of the step's verify forward (`mixed.py`), as many as the batch has free rows,
and always at least one so prompts are prefilled ahead of the rows that will free up. A step
with no ready sequence runs the riders' chunks in a forward of their own.

Scheduling never changes a sequence's tokens: the group is still chosen by the policy, only from
the ready sequences.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specviz.engine.kv.window import uses_window_masks

if TYPE_CHECKING:
    from specviz.engine.batch import SeqState
    from specviz.engine.step import Engine


def mixes(engine: Engine) -> bool:
    """Whether EXSPEC carries prefill chunks in verify forwards: chunked prefill, a chain (a tree's
    4-D mask has no rider rows), no proposer reading the target's hidden states (a head is handed
    the prefill's), and full-attention models (window masks count tokens per row of a plain block)."""
    config = engine.config
    models: list[Any] = [engine.target] + ([engine.draft] if engine.draft is not None else [])
    hidden = engine.proposer is not None and engine.proposer.needs_hidden
    return (
        bool(config.prefill_chunk)
        and not config.tree_branches
        and not hidden
        and not any(uses_window_masks(m) for m in models)
    )


def split_window(window: list[SeqState], admitted: dict[int, int]) -> tuple[list[SeqState], list[SeqState]]:
    """The window's ready sequences (in the pools: `admitted` seq_id -> pool row) and waiting ones, in order."""
    ready = [s for s in window if s.seq_id in admitted]
    return ready, [s for s in window if s.seq_id not in admitted]


def riders_for(waiting: list[SeqState], running: int, batch_size: int) -> list[SeqState]:
    """The waiting sequences that get a chunk this step: the batch's free rows' worth, at least one."""
    return waiting[: max(1, batch_size - running)]
