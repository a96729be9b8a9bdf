"""A persistent KV pool: every sequence's cache lives in one row of preallocated tensors for its whole life.

Per layer, keys and values are [rows, H, width, D]. A sequence's slots start at slot 0 of its row
(`lengths` of them), with its mask and next position beside them. A step touches the pool twice:

- `take`: one gather per tensor builds the left-padded batch of a group (each row shifted right
  by its padding), exactly the batch stacking single-row caches would build;
- `store_step`: after the step, only the slots the step wrote (the verify or draft block, k + 1
  per row) are scattered to the end of each row; rejected drafts land past the row's new length,
  where nothing reads them and the next step overwrites them.

A plan that also rewrites old slots (a fault that keeps padding) takes the slow path: the batch is
rebuilt (`moves.rebuild`) and whole rows are stored. Neither path loops over rows or layers in Python
per row, as splitting and stacking single-row caches every step did.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specviz.engine.kv.headroom import HeadroomLayer, storage
from specviz.engine.kv.moves import HeadroomGather, flat_index, rebuild
from specviz.engine.kv.state import CachePlan, KVState, cache_layers


class KVPool:
    def __init__(self, rows: int, width: int, device: torch.device, headroom: int = 0) -> None:
        self.rows = rows
        self.headroom = headroom  # free slots past a taken batch's width, for its forwards (headroom.py)
        self.width = width
        self.device = device
        self.mask = torch.zeros(rows, width, dtype=torch.long, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)  # slots each row holds
        self.next_pos = torch.zeros(rows, dtype=torch.long, device=device)
        self.keys: list[torch.Tensor] = []  # per layer [rows, H, width, D], allocated at the first store
        self.values: list[torch.Tensor] = []
        self.row_of: dict[int, int] = {}  # seq_id -> pool row
        self.free = list(range(rows - 1, -1, -1))

    # ------------------------------------------------------------------ sequences in and out

    def admit(self, seq_id: int, state: KVState) -> None:
        """Give `seq_id` a row and store its single-row state (a prefill, no padding) there."""
        self.assign(seq_id)
        self._store_rows([seq_id], state, torch.full((1,), state.width, device=self.device))

    def release(self, seq_id: int) -> None:
        self.free.append(self.row_of.pop(seq_id))

    # ------------------------------------------------------------------ a step

    def take(self, seq_ids: list[int]) -> KVState:
        """The left-padded batch of `seq_ids`: one gather per tensor."""
        rows = self.row_indices(seq_ids)
        lengths = self.lengths.index_select(0, rows)
        width = int(lengths.max()) if len(seq_ids) else 0
        mask = self.batch_mask(rows, lengths, width)
        next_pos = self.next_pos.index_select(0, rows)
        if width == 0 or not self.keys:
            return KVState(cache=None, mask=mask, next_pos=next_pos)
        gather = HeadroomGather(rows, left_padded_sources(lengths, width)[0])
        cache = DynamicCache()
        for keys, values in zip(self.keys, self.values):
            layer = HeadroomLayer(self.headroom)
            layer.hold(gather(keys, layer.headroom), gather(values, layer.headroom), width)
            cache.layers.append(layer)
        return KVState(cache=cache, mask=mask, next_pos=next_pos)

    def batch_mask(self, rows: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
        """The mask of pool `rows` in a left-padded batch of `width` (each row shifted by its padding)."""
        if not width:
            return self.mask[rows, :0]
        src, real = left_padded_sources(lengths, width)  # batch slot j of row b <- pool slot j - pad_b
        return self.mask.index_select(0, rows).gather(1, src) * real

    def assign(self, seq_id: int) -> None:
        """Give `seq_id` a row whose slots are stored later (`placement.place_batch` prefills it into a batch)."""
        self.row_of[seq_id] = self.free.pop()

    def store_step(
        self,
        seq_ids: list[int],
        state: KVState,
        old_width: int,
        rows: torch.Tensor,
        plan: CachePlan,
        whole_rows: bool = False,
    ) -> None:
        """After a step on a batch taken from the pool: keep what `plan` keeps for the continuing
        `rows` (batch rows, holding `seq_ids`). `state` is the batch after the step: `old_width`
        slots as taken, then the slots the step wrote. `whole_rows`: the pool rows are behind by
        more than this step (the batch was carried over steps without storing): store them whole."""
        pool_rows = self.row_indices(seq_ids)
        lengths = self.lengths.index_select(0, pool_rows)
        retain, attend = plan.retain.index_select(0, rows), plan.attend.index_select(0, rows)
        # Old slots rewritten, or kept new slots not a prefix of the written ones (a tree): whole rows.
        if whole_rows or plan.scattered or not bool((retain[:, :old_width].sum(1) == lengths).all()):
            rebuilt = rebuild(state, rows, plan)
            self._store_rows(seq_ids, rebuilt, retain.sum(1))
            return
        written = state.width - old_width
        self._fit(int((lengths + written).max()) if len(seq_ids) else 0)
        slots = lengths[:, None] + torch.arange(written, device=self.device)  # [B', written] pool slots
        mask_dest = (pool_rows[:, None] * self.width + slots).reshape(-1)
        self.mask.view(-1).index_copy_(0, mask_dest, attend[:, old_width:].long().reshape(-1))
        self.lengths.index_copy_(0, pool_rows, lengths + retain[:, old_width:].sum(1))
        self.next_pos.index_copy_(0, pool_rows, plan.next_pos.index_select(0, rows))
        if state.cache is None or written == 0:
            return
        layers = cache_layers(state.cache)
        if not self.keys:
            self._allocate(layers[0].keys, len(layers))
        heads, dim = self.keys[0].shape[1], self.keys[0].shape[3]
        dest = flat_index(pool_rows, slots, heads, self.width)
        for i, layer in enumerate(layers):
            block = layer.keys[:, :, old_width:].index_select(0, rows)
            self.keys[i].view(-1, dim).index_copy_(0, dest, block.reshape(-1, dim))
            block = layer.values[:, :, old_width:].index_select(0, rows)
            self.values[i].view(-1, dim).index_copy_(0, dest, block.reshape(-1, dim))

    # ------------------------------------------------------------------ helpers

    def _store_rows(self, seq_ids: list[int], state: KVState, counts: torch.Tensor) -> None:
        """Store whole rows of a left-padded `state`: row i's last `counts[i]` slots, from slot 0."""
        pool_rows = self.row_indices(seq_ids)
        width = state.width
        self._fit(width)
        slots = torch.arange(width, device=self.device)[None, :].expand(len(seq_ids), -1)
        real = slots < counts[:, None]
        src = (slots + (width - counts)[:, None]).clamp(max=max(width - 1, 0))
        mask_rows = torch.zeros(len(seq_ids), self.width, dtype=torch.long, device=self.device)
        if width:
            mask_rows[:, :width] = state.mask.gather(1, src) * real
        self.mask.index_copy_(0, pool_rows, mask_rows)
        self.lengths.index_copy_(0, pool_rows, counts.to(self.device))
        self.next_pos.index_copy_(0, pool_rows, state.next_pos)
        if state.cache is None or width == 0:
            return
        layers = cache_layers(state.cache)
        if not self.keys:
            self._allocate(layers[0].keys, len(layers))
        heads = self.keys[0].shape[1]
        batch_rows = torch.arange(len(seq_ids), device=self.device)
        dest = flat_index(pool_rows, slots, heads, self.width)[_flat_real(real, heads)]
        for i, layer in enumerate(layers):
            for pool_tensor, source in zip((self.keys[i], self.values[i]), storage(layer)):
                take = flat_index(batch_rows, src, heads, source.shape[2])[_flat_real(real, heads)]
                dim = source.shape[3]
                pool_tensor.view(-1, dim).index_copy_(0, dest, source.view(-1, dim).index_select(0, take))

    def row_indices(self, seq_ids: list[int]) -> torch.Tensor:
        return torch.tensor([self.row_of[s] for s in seq_ids], dtype=torch.long, device=self.device)

    def _allocate(self, like: torch.Tensor, num_layers: int) -> None:
        # Zeros, not empty: slots past a row's length are gathered as padding, masked but multiplied.
        shape = (self.rows, like.shape[1], self.width, like.shape[3])
        self.keys = [like.new_zeros(shape) for _ in range(num_layers)]
        self.values = [like.new_zeros(shape) for _ in range(num_layers)]

    def _fit(self, width: int) -> None:
        """Widen the pool if a row outgrew it (only a faulty plan keeps more slots than tokens)."""
        if width <= self.width:
            return
        extra = width - self.width
        self.mask = torch.nn.functional.pad(self.mask, (0, extra))
        self.keys = [torch.nn.functional.pad(k, (0, 0, 0, extra)) for k in self.keys]
        self.values = [torch.nn.functional.pad(v, (0, 0, 0, extra)) for v in self.values]
        self.width = width


def left_padded_sources(lengths: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For a left-padded batch of `width`: each batch slot's pool slot, and whether it is real."""
    slots = torch.arange(width, device=lengths.device)[None, :] - (width - lengths)[:, None]
    return slots.clamp(min=0), (slots >= 0).long()


def _flat_real(real: torch.Tensor, heads: int) -> torch.Tensor:
    """`real` [B, S] repeated over heads, in `flat_index`'s order."""
    return real[:, None, :].expand(-1, heads, -1).reshape(-1)
