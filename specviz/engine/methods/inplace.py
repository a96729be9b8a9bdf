"""INPLACE: zero-copy ragged decoding in fixed per-row cache regions (`kv/regions.py`).

Each row of a static batch owns one region of its caches; a step writes each row's query block at
its own length and keeps what the plan keeps by growing the row's length, so no slot ever moves.
Rows are prefilled in groups of similar length and ordered longest prompt first, so the rows that
move when others finish (`regions.new_order`) are the short, cheap ones.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch

from specviz.engine.batch import Batch, SeqState
from specviz.engine.kv.regions import LAYOUT, RegionCache, RegionState, apply_plan, block_mask, new_order, settled
from specviz.engine.methods.base import Method
from specviz.engine.methods.static import run_static
from specviz.engine.prefill import PrefillRecord, chunk_records
from specviz.engine.step import Engine, StepOutcome
from specviz.errors import SpecvizError

if TYPE_CHECKING:
    from specviz.engine.config import RunConfig


def num_layers(model: Any) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
        raise SpecvizError("--method inplace supports full-attention models only (no sliding-window layers)")
    return config.num_hidden_layers


# A prefill group may cost this many times its rows' own tokens once padded to its longest row.
PREFILL_SLACK = 1.25


def prefill_groups(lengths: list[int]) -> list[list[int]]:
    """Rows grouped for prefill, longest first, so padding each group to its longest row wastes
    little: one long prompt among short ones is prefilled on its own, not the whole batch padded
    to its length (on CPU that padding cost more than all the decode steps)."""
    groups: list[list[int]] = []
    longest = tokens = 0
    for row in sorted(range(len(lengths)), key=lambda r: -lengths[r]):
        n = lengths[row]
        if n == 0:
            continue  # nothing to cache yet (a one-token prompt)
        if groups and longest * (len(groups[-1]) + 1) <= PREFILL_SLACK * (tokens + n):
            groups[-1].append(row)
            tokens += n
        else:
            groups.append([row])
            longest = tokens = n
    return groups


@torch.no_grad()
def prefill_regions(engine: Engine, model: Any, seqs: list[SeqState], width: int) -> RegionState:
    """Cache every committed token but the pending one at slots 0.. of each row's region.

    Rows are prefilled in groups of similar length (`prefill_groups`), each right-padded to its
    longest row; a short row's padding lands on slots past its length, which its mask never
    covers and its next query block overwrites. Every row sees only its own slots, so the
    grouping changes no key or value. With `--prefill-chunk N` a group goes in N columns at a
    time, each chunk attending the slots its earlier chunks filled (slot i holds token i, so a
    chunk's first position and the slots it attends before itself both equal its start).
    """
    device, is_target = engine.device, model is engine.target
    contexts = [(s.prompt_ids + s.output_ids)[:-1] for s in seqs]
    lengths = torch.tensor([len(c) for c in contexts], device=device)
    slots = RegionCache(num_layers(model), width, len(seqs))
    records = chunk_records(engine, seqs, draft=not is_target) if engine.config.prefill_chunk else None
    for group in prefill_groups([len(c) for c in contexts]):
        longest = max(len(contexts[r]) for r in group)
        ids = torch.full((len(group), longest), engine.config.pad_id, dtype=torch.long, device=device)  # [G, L]
        for i, row in enumerate(group):
            ids[i, : len(contexts[row])] = torch.tensor(contexts[row], device=device)
        size = engine.config.prefill_chunk or longest
        hidden = []
        for start in range(0, max(longest, 1), max(size, 1)):  # a group of one-token prompts: one empty forward
            end = min(longest, start + size)
            fed = ids[:, start:end]  # [G, c]
            if records is not None and not is_target and start:
                fed = _boundary_feed(engine, [records[r] for r in group], [seqs[r] for r in group], fed, start)
            query_slots = torch.arange(start, end, device=device)[None, :].expand(len(group), -1)  # [G, c]
            slots.rows, slots.prefill_start = torch.tensor(group, device=device), start
            try:
                with engine.capture_hidden() if is_target else nullcontext(None) as tap:
                    out = model(
                        input_ids=fed,
                        attention_mask=block_mask(query_slots, end, model.dtype),  # own slots up to the query
                        position_ids=query_slots,  # logical indices: slot i holds token i
                        cache=slots,
                        use_cache=True,
                    )
            finally:
                slots.rows, slots.prefill_start = None, 0
            if tap is not None and tap.hidden is not None:
                hidden.append(tap.hidden)
            if records is not None:
                _note([records[r] for r in group], [len(contexts[r]) for r in group], is_target, fed, start, out.logits)
        if hidden:
            engine.proposer.prefilled(
                engine, [seqs[r] for r in group], torch.cat(hidden, dim=1), [len(contexts[r]) - 1 for r in group]
            )
    return settled(slots, lengths, lengths.clone(), longest=max((len(c) for c in contexts), default=0))


def _boundary_feed(
    engine: Engine, records: list[PrefillRecord], seqs: list[SeqState], fed: torch.Tensor, start: int
) -> torch.Tensor:
    """[G, c] what the draft is fed at a chunk boundary (the fault hook; the context's own tokens)."""
    predicted = torch.tensor([r.predicted.get(start, -1) for r in records], device=fed.device)  # [G]
    real = torch.tensor([len(s.prompt_ids) + len(s.output_ids) - 1 > start for s in seqs], device=fed.device)  # [G]
    return engine.fault.draft_chunk_tokens(fed, predicted, real, [s.seq_id for s in seqs])


def _note(
    records: list[PrefillRecord],
    lengths: list[int],
    is_target: bool,
    fed: torch.Tensor,
    start: int,
    logits: torch.Tensor,
) -> None:
    """One chunk of a right-padded group (columns `start` .. of `fed` [G, c]), per row with tokens
    in it: the target's span (start, end, first position, slots attended before) and its choice
    after the span's last token, or the draft's fed tokens."""
    for i, (record, n) in enumerate(zip(records, lengths)):
        count = min(n, start + fed.shape[1]) - start
        if count <= 0:
            continue
        if not is_target:
            record.draft_fed = (record.draft_fed or []) + fed[i, :count].tolist()
            continue
        record.chunks.append([start, start + count, start, start])
        record.predicted[start + count] = int(logits[i, count - 1].argmax())


def region_width(seqs: list[SeqState], max_new_tokens: int, k: int, branches: int = 0) -> int:
    """RegionCache per row: the longest prompt, every new token, and one query block past the last
    length (k + 1 slots; a tree's adds its `branches` alternatives)."""
    return max(len(s.prompt_ids) for s in seqs) + max_new_tokens + k + 1 + branches


def longest_first(chunk: list[SeqState]) -> list[SeqState]:
    """The batch's rows, longest prompt first (stable). Rows that move when others finish are
    taken from the back (`new_order`), and a move copies the mover's slots: with short rows at
    the back, the rows that move are the cheap ones. A long row in front never moves."""
    return sorted(chunk, key=lambda s: -len(s.prompt_ids))


def prefill(engine: Engine, chunk: list[SeqState], batch_id: int) -> Batch:
    """Longest prompt first; each model's caches prefilled into fixed regions."""
    chunk = longest_first(chunk)
    width = region_width(chunk, engine.max_new_tokens, engine.k, engine.config.tree_branches)
    target = prefill_regions(engine, engine.target, chunk, width)
    draft = prefill_regions(engine, engine.draft, chunk, width) if engine.draft is not None else None
    return Batch(chunk, target, draft, batch_id)


def apply(batch: Batch, outcome: StepOutcome) -> tuple[Batch, list[int | None]]:
    """Grow each kept row's length by what its plan keeps; finished rows' places are filled."""
    rows = outcome.active_rows.tolist()
    order, holes, movers = new_order(rows)
    target = apply_plan(batch.target, order, holes, movers, outcome.target_plan)
    draft = None
    if batch.draft is not None and outcome.draft_plan is not None:
        draft = apply_plan(batch.draft, order, holes, movers, outcome.draft_plan)
    pads: list[int | None] = [None] * len(batch.seqs)
    for row in rows:
        pads[row] = 0  # no padding in this layout
    return Batch([batch.seqs[r] for r in order], target, draft, batch.batch_id), pads


def run_inplace(engine: Engine, seqs: list[SeqState], batch_size: int) -> None:
    """Static batches of `batch_size`, each decoded in its own fixed-region caches until every row ends."""
    run_static(engine, seqs, batch_size, prefill, apply)


def run(engine: Engine, seqs: list[SeqState], config: RunConfig) -> dict[str, Any]:
    """The method runner; no header options (the header's layout is `LAYOUT`)."""
    run_inplace(engine, seqs, config.batch_size)
    return {}


METHOD = Method(run, layout=LAYOUT)
