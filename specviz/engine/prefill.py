"""Prefill: cache every committed token but the pending one, left-padded, whole or in chunks.

Whole (`EngineConfig.prefill_chunk` 0): one forward over the batch's contexts. Chunked (N > 0):
forwards over N columns of the left-padded contexts at a time, so a row's context goes in as
chunks of at most N tokens, each attending the slots its earlier chunks cached. The cache, mask
and positions end the same either way; only the number of forwards (and their peak activation
memory) differs.

EXSPEC mixes its chunks into verify forwards instead (`mixed.py`), and records them the same way,
each with the step that carried it (here: -1, a forward of its own). A chunked prefill leaves, per
sequence, what it fed (`PrefillRecord`), which the sequence's next step records
(`prefill_chunks`, `draft_prefill_tokens`) for the chunk-continuity checks: each chunk starts
where the last ended, at the position and attended width of its first token, and the draft is
fed the context's own tokens at every chunk boundary (SGLang PR #26329 fed it the target's
predicted token there: the `chunk-boundary-feed` fault).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from specviz.engine.kv.headroom import with_headroom
from specviz.engine.kv.state import KVState, feed

if TYPE_CHECKING:
    from specviz.engine.batch import SeqState
    from specviz.engine.faults import Fault
    from specviz.engine.proposers.base import Proposer


@dataclass
class PrefillRecord:
    """What a chunked prefill fed one sequence, until its next step records it."""

    # target: [start, end, first position, slots before, carrier step (-1: a forward of its own; mixed.py)]
    chunks: list[list[int]] = field(default_factory=list)
    draft_fed: list[int] | None = None  # the tokens fed to the draft, in order
    predicted: dict[int, int] = field(default_factory=dict)  # context index -> the target's choice for it


class Prefills(Protocol):
    """Where the run keeps each sequence's record until its next step takes it (`RunContext`)."""

    prefills: dict[int, PrefillRecord]


class PrefillEngine(Protocol):
    """What a prefill reads of the engine (`step.Engine` is one). A protocol, not the class: the
    engine's step calls the prefill, so the prefill naming the engine would make a circle."""

    device: torch.device
    target: Any
    config: Any  # EngineConfig: prefill_chunk, pad_id
    fault: Fault
    proposer: Proposer | None
    context: Prefills

    @property
    def cache_headroom(self) -> int: ...

    def capture_hidden(self) -> Any: ...


@torch.no_grad()
def prefill(engine: PrefillEngine, model: Any, seqs: list[SeqState], cache: Any | None = None) -> KVState:
    """The batch's contexts cached in `model`'s cache (`cache`: an empty one to write into)."""
    device, is_target = engine.device, model is engine.target
    contexts = [s.prompt_ids + s.output_ids[:-1] if s.output_ids else s.prompt_ids[:-1] for s in seqs]
    width = max(len(c) for c in contexts)
    lengths = torch.tensor([len(c) for c in contexts], device=device)
    state = KVState(cache=cache, mask=torch.zeros(len(seqs), 0, dtype=torch.long, device=device), next_pos=lengths)
    if width == 0:
        return state
    ids = torch.full((len(seqs), width), engine.config.pad_id, dtype=torch.long, device=device)  # [B, W]
    mask = torch.zeros(len(seqs), width, dtype=torch.long, device=device)  # [B, W]
    for row, context in enumerate(contexts):
        if context:
            ids[row, width - len(context) :] = torch.tensor(context, device=device)
            mask[row, width - len(context) :] = 1
    positions = (mask.cumsum(1) - 1).clamp(min=0)  # [B, W]
    size = engine.config.prefill_chunk or width
    records = chunk_records(engine, seqs, draft=not is_target) if engine.config.prefill_chunk else None
    hidden = []
    for start in range(0, width, size):
        cols = slice(start, min(width, start + size))
        fed = ids[:, cols]  # [B, c]
        if records is not None and not is_target and start:
            fed = engine.fault.draft_chunk_tokens(
                fed, _predicted(records, mask, start), mask[:, start], [s.seq_id for s in seqs]
            )
        before = state.mask.sum(1)  # [B] attended slots before the chunk
        with engine.capture_hidden() if is_target else nullcontext(None) as tap:
            logits = feed(model, state, fed, positions[:, cols], query_mask=mask[:, cols])  # [B, c, V]
        if tap is not None and tap.hidden is not None:
            hidden.append(tap.hidden)
        if records is not None:
            _note(records, is_target, fed, mask, cols, positions[:, cols], before, logits)
    if hidden:
        engine.proposer.prefilled(engine, seqs, torch.cat(hidden, dim=1), [width - 1 if c else -1 for c in contexts])
    state.cache = with_headroom(state.cache, engine.cache_headroom)
    return state


def chunk_records(engine: PrefillEngine, seqs: list[SeqState], draft: bool = False) -> list[PrefillRecord]:
    """Each sequence's record, kept on the run until its next step takes it; `draft`: its draft
    prefill starts now, so what the draft was fed starts empty (a one-token prompt's draft is fed
    nothing, and says so)."""
    pending = engine.context.prefills
    records = [pending.setdefault(seq.seq_id, PrefillRecord()) for seq in seqs]
    for record in records if draft else ():
        record.draft_fed = []
    return records


def _predicted(records: list[PrefillRecord], mask: torch.Tensor, column: int) -> torch.Tensor:
    """[B] the target's choice for the token at `column` (-1: none), from its own chunked prefill."""
    index = mask[:, :column].sum(1).tolist()  # context index of the token at `column`
    return torch.tensor([r.predicted.get(i, -1) for r, i in zip(records, index)], device=mask.device)


def _note(
    records: list[PrefillRecord],
    is_target: bool,
    fed: torch.Tensor,
    mask: torch.Tensor,
    cols: slice,
    positions: torch.Tensor,
    before: torch.Tensor,
    logits: torch.Tensor,
) -> None:
    """One chunk (columns `cols` of the contexts' `mask` [B, W]), per row that had tokens in it:
    the target's span, or the draft's fed tokens. The span's start is read off the mask (tokens in
    earlier columns), the attended slots before it off the cache: the check compares the two."""
    real = mask[:, cols].bool()  # [B, c]
    starts = mask[:, : cols.start].sum(1).tolist()
    choices = logits[:, -1].argmax(-1).tolist() if is_target else None  # the target's next token after the chunk
    for row, record in enumerate(records):
        count = int(real[row].sum())
        if not count:
            continue
        tokens = fed[row][real[row]].tolist()
        if not is_target:
            record.draft_fed = (record.draft_fed or []) + tokens
            continue
        first = int(real[row].long().argmax())
        start = starts[row]
        position = int(positions[row, first])
        record.chunks.append([start, start + count, position, int(before[row]), -1])  # -1: a forward of its own
        record.predicted[start + count] = choices[row]
