"""A group's batch placed directly: new sequences are prefilled straight into their batch rows.

EXSPEC prefills every sequence alone (no padding), then runs it in groups. Storing each prefill in
the pool and gathering the group from the pool copies every new sequence's cache twice before its
first step, and the gather is the step's alignment: at large batches of long prompts it cost more
alignment in the first step than EQSPEC's padded batch prefill spends on assembly (none: its
prefill writes the batch directly; benchmarks/README.md, "Engine modules"). Here the batch
buffers ([B, H, width + headroom, D] per layer) are allocated first (`place_batch`); a new
sequence's prefill forward writes its keys and values at its left-padded place in its batch row
(`RowWriter`), so its first batch costs no copy at all, and rows already in the pool are
gathered into theirs. The pool learns the new rows' slots when the
group next changes (the batch is stored whole then; see `exspec._store`).

Only for models whose every layer the engine masks itself (full attention, or sliding windows
that `window.py` masks per row): a model whose sliding layers HF keeps needs HF's own cache
layers, and takes the pool's `admit` + `take` path instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from specviz.engine.kv.headroom import HeadroomLayer, headroom_for
from specviz.engine.kv.moves import HeadroomGather
from specviz.engine.kv.pool import KVPool, left_padded_sources
from specviz.engine.kv.state import KVState
from specviz.engine.kv.window import window_spec


def prefills_in_place(model: Any) -> bool:
    """Whether every layer of `model` can take a plain full cache layer (the engine masks windows)."""
    return window_spec(model).problem() is None


@dataclass
class BatchBuffers:
    """Per-layer key and value buffers of one batch, allocated at their first write."""

    batch: int
    capacity: int  # width + headroom
    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)

    def layer(self, index: int, key_like: torch.Tensor, value_like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if index not in self.keys:
            for store, like in ((self.keys, key_like), (self.values, value_like)):
                store[index] = like.new_empty(self.batch, like.shape[1], self.capacity, like.shape[-1])
        return self.keys[index], self.values[index]


class RowWriter(DynamicLayer):
    """One layer of a single-row prefill whose slots are its row of the batch buffers, from `pad` on.

    Attention sees exactly the row's own slots (a view of the buffer); the padding before them is
    zeroed (masked, but multiplied: never garbage)."""

    def __init__(self, buffers: BatchBuffers, index: int, row: int, pad: int) -> None:
        super().__init__()
        self.buffers, self.index, self.row, self.pad = buffers, index, row, pad

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self.buffers.layer(self.index, key_states, value_states)
        start = self.pad + (self.keys.shape[-2] if self.keys.numel() else 0)
        end = start + key_states.shape[-2]
        if start == self.pad:
            keys[self.row, :, : self.pad].zero_()
            values[self.row, :, : self.pad].zero_()
        keys[self.row, :, start:end].copy_(key_states[0])
        values[self.row, :, start:end].copy_(value_states[0])
        self.keys = keys[self.row : self.row + 1, :, self.pad : end]
        self.values = values[self.row : self.row + 1, :, self.pad : end]
        return self.keys, self.values


class _RowLayers:
    """`Cache(layer_class_to_replicate=...)` calls this once per layer, in order."""

    def __init__(self, buffers: BatchBuffers, row: int, pad: int) -> None:
        self.buffers, self.row, self.pad, self.next_index = buffers, row, pad, 0

    def __call__(self) -> RowWriter:
        self.next_index += 1
        return RowWriter(self.buffers, self.next_index - 1, self.row, self.pad)


# prefill(row of the batch, a cache to prefill into) runs the model on that row's context
Prefill = Callable[[int, Any], None]


def place_batch(pool: KVPool, seq_ids: list[int], fresh: dict[int, int], prefill: Prefill) -> KVState:
    """The left-padded batch of `seq_ids`; those in `fresh` (seq_id -> slots to cache) are not in
    the pool: each gets a pool row (filled later) and is prefilled into its batch row."""
    for seq_id in fresh:
        pool.assign(seq_id)
    rows = pool.row_indices(seq_ids)
    is_fresh = torch.tensor([s in fresh for s in seq_ids], device=pool.device)
    fresh_lengths = torch.tensor([fresh.get(s, 0) for s in seq_ids], device=pool.device)
    lengths = torch.where(is_fresh, fresh_lengths, pool.lengths.index_select(0, rows))
    width = int(lengths.max()) if len(seq_ids) else 0
    slots = torch.arange(width, device=pool.device)[None, :]
    pads = width - lengths
    fresh_mask = (slots >= pads[:, None]).long()
    pooled_mask, next_pos = pool.batch_mask(rows, lengths, width), pool.next_pos.index_select(0, rows)
    mask = torch.where(is_fresh[:, None], fresh_mask, pooled_mask)
    next_pos = torch.where(is_fresh, fresh_lengths, next_pos)
    if width == 0:
        return KVState(cache=None, mask=mask, next_pos=next_pos)
    buffers = BatchBuffers(len(seq_ids), width + headroom_for(pool.headroom))
    pooled = (~is_fresh).nonzero().flatten()
    if len(pooled) and pool.keys:
        sources = left_padded_sources(lengths.index_select(0, pooled), width)[0]
        gather = HeadroomGather(rows.index_select(0, pooled), sources)
        for i, (keys, values) in enumerate(zip(pool.keys, pool.values)):
            batch_keys, batch_values = buffers.layer(i, keys, values)
            batch_keys[pooled, :, :width] = gather(keys, 0)
            batch_values[pooled, :, :width] = gather(values, 0)
    for row, seq_id in enumerate(seq_ids):
        if fresh.get(seq_id):
            prefill(row, Cache(layer_class_to_replicate=_RowLayers(buffers, row, int(pads[row]))))
    for row, seq_id in enumerate(seq_ids):
        # rows nothing wrote (no context yet, in the pool or new): all padding, zeroed, never garbage
        if (seq_id in fresh and not fresh[seq_id]) or (seq_id not in fresh and not pool.keys):
            for i in buffers.keys:
                buffers.keys[i][row, :, :width].zero_()
                buffers.values[i][row, :, :width].zero_()
    cache = DynamicCache()
    for i in sorted(buffers.keys):
        layer = HeadroomLayer(pool.headroom)
        layer.hold(buffers.keys[i], buffers.values[i], width)
        cache.layers.append(layer)
    return KVState(cache=cache if cache.layers else None, mask=mask, next_pos=next_pos)
