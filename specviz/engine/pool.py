"""A persistent KV pool: every sequence's cache lives in one row of preallocated tensors for its whole life.

Per layer, keys and values are [rows, H, width, D]; a sequence's slots sit right-aligned in its row
(left-padded, like one row of an EQSPEC batch), with its mask [width] and next position beside them.
Forming a batch is one gather of rows per tensor (`take`), returning it one scatter of rows (`put`):
the cost no longer grows with a Python loop over rows and layers, as single-row caches split and
stacked every step did.

Slots left of a row's region are stale but finite (the pool starts zeroed) and masked, so a batch
gathered from the pool is the left-padded batch that stacking single-row caches would build.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from specviz.engine.kv import KVState, cache_layers, leading_zeros


class KVPool:
    def __init__(self, rows: int, width: int, device: torch.device) -> None:
        self.rows = rows
        self.width = width
        self.device = device
        self.mask = torch.zeros(rows, width, dtype=torch.long, device=device)
        self.next_pos = torch.zeros(rows, dtype=torch.long, device=device)
        self.keys: list[torch.Tensor] = []  # per layer [rows, H, width, D], allocated at the first put
        self.values: list[torch.Tensor] = []
        self.row_of: dict[int, int] = {}  # seq_id -> pool row
        self.free = list(range(rows - 1, -1, -1))

    def admit(self, seq_id: int, state: KVState) -> None:
        """Give `seq_id` a row and store its single-row state (a prefill) there."""
        self.row_of[seq_id] = self.free.pop()
        self.put([seq_id], state)

    def release(self, seq_id: int) -> None:
        self.free.append(self.row_of.pop(seq_id))

    def take(self, seq_ids: list[int]) -> KVState:
        """The left-padded batch of `seq_ids`: each row trimmed of the padding all rows share."""
        rows = self._rows(seq_ids)
        mask = self.mask.index_select(0, rows)
        width = self.width - int(leading_zeros(mask).min()) if len(seq_ids) else 0
        mask = mask[:, self.width - width :]
        next_pos = self.next_pos.index_select(0, rows)
        if width == 0 or not self.keys:
            return KVState(cache=None, mask=mask, next_pos=next_pos)
        cache = DynamicCache()
        start = self.width - width
        for keys, values in zip(self.keys, self.values):
            layer = DynamicLayer()
            layer.lazy_initialization(keys, values)
            layer.keys = keys[:, :, start:].index_select(0, rows)
            layer.values = values[:, :, start:].index_select(0, rows)
            cache.layers.append(layer)
        return KVState(cache=cache, mask=mask, next_pos=next_pos)

    def put(self, seq_ids: list[int], state: KVState) -> None:
        """Store the rows of `state` (row i holds `seq_ids[i]`) right-aligned in their pool rows."""
        rows = self._rows(seq_ids)
        self._fit(state.width)
        start = self.width - state.width
        self.mask.index_copy_(0, rows, torch.nn.functional.pad(state.mask, (start, 0)))
        self.next_pos.index_copy_(0, rows, state.next_pos)
        if state.cache is None or state.width == 0:
            return
        layers = cache_layers(state.cache)
        if not self.keys:
            self._allocate(layers[0].keys, len(layers))
        for i, layer in enumerate(layers):
            self.keys[i][:, :, start:].index_copy_(0, rows, layer.keys)
            self.values[i][:, :, start:].index_copy_(0, rows, layer.values)

    def _rows(self, seq_ids: list[int]) -> torch.Tensor:
        return torch.tensor([self.row_of[s] for s in seq_ids], dtype=torch.long, device=self.device)

    def _allocate(self, like: torch.Tensor, num_layers: int) -> None:
        shape = (self.rows, like.shape[1], self.width, like.shape[3])
        self.keys = [like.new_zeros(shape) for _ in range(num_layers)]
        self.values = [like.new_zeros(shape) for _ in range(num_layers)]

    def _fit(self, width: int) -> None:
        """Widen the pool (right-aligned) if a state outgrew it; only a faulty plan keeps growing rows."""
        if width <= self.width:
            return
        extra = width - self.width
        self.mask = torch.nn.functional.pad(self.mask, (extra, 0))
        self.keys = [torch.nn.functional.pad(k, (0, 0, extra, 0)) for k in self.keys]
        self.values = [torch.nn.functional.pad(v, (0, 0, extra, 0)) for v in self.values]
        self.width = width
