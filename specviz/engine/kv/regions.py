"""The fixed-region layout: each row of a static batch owns `width` cache slots, and nothing moves.

Per layer, keys and values are [B, H, width, D] (preallocated). A row with n committed tokens holds
the KV of its first n - 1 tokens in slots 0 .. n-2 of its region; every forward writes its query
block at the row's own length (slots n-1, n, ...), so rows of different lengths need no padding:

- the attention mask is 4-D and follows each row's length: query j of a row whose block starts
  at slot s0 attends slots 0 .. s0 + j (its committed prefix plus the causal part of its block),
  never the stale slots past it;
- rejected drafts stay where they were written and the row's length simply does not cover them;
  the next step's query block overwrites them;
- positions are logical indices, fed explicitly, as in every layout.

A step's attention reads only the region's used prefix (the span), rounded up to SPAN_STEP slots,
so shapes take few values (B, the span, the query length), which is what CUDA graphs need. When
rows finish, the batch keeps running on a prefix of its rows: each finished row inside the new
prefix takes in one surviving row from past it (`RegionCache.fill_holes`, `new_order`): a step copies
at most as many rows as finished in it, only their attended slots, and the prefix is a view.

For the recorder the layout is described logically: a step's fed mask row is the row's region
(`width` slots, the first n - 1 attended) followed by the query block, so `kv_len`, `mask_rle` and
the KV checks read the same fields as for the left-padded layout; the trace header declares the
layout "fixed-slots", so the rectangular-alignment rule (a left-padded rule) does not apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from specviz.engine.kv.state import CachePlan, KVState
from specviz.errors import SpecvizError

LAYOUT = "fixed-slots"
SPAN_STEP = 64  # a step attends its region's used prefix, rounded up to a multiple of this


class RegionLayer(CacheLayerMixin):
    """One layer's fixed-width keys and values; `update` writes each row's block at its own slots."""

    is_sliding = False

    def __init__(self, slots: RegionCache) -> None:
        super().__init__()
        self.slots = slots

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        _, heads, _, dim = key_states.shape
        shape = (self.slots.batch, heads, self.slots.width, dim)
        self.keys = key_states.new_zeros(shape)
        self.values = value_states.new_zeros(shape)
        self.device = key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        rows = self.slots.rows
        if rows is None:  # a step: the batch is the first `active` rows
            index = self.slots.write_index(key_states.shape)
            keys, values = self.keys[: self.slots.active], self.values[: self.slots.active]  # views
            keys.scatter_(2, index, key_states)
            values.scatter_(2, index, value_states)
            span = self.slots.span  # the used prefix of the region: the 4-D mask says which slots count
            return keys[:, :, :span], values[:, :, :span]
        # A prefill group: any rows, its block filling slots start .. start+q-1 (a chunked prefill
        # has cached slots 0 .. start-1 of these rows; a whole one starts at 0). Write those slots
        # and attend only the rows' slots up to them: the rest of the region is empty, and
        # attending it would make a short prompt's prefill cost the region's width.
        start, q = self.slots.prefill_start, key_states.shape[2]
        self.keys[:, :, start : start + q].index_copy_(0, rows, key_states)
        self.values[:, :, start : start + q].index_copy_(0, rows, value_states)
        if not start:
            return key_states, value_states
        return self.keys[rows, :, : start + q], self.values[rows, :, : start + q]  # [G, H, start + q, D]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return (self.slots.span if self.slots.rows is None else self.slots.prefill_start + query_length), 0

    def get_seq_length(self) -> int:
        return self.slots.width

    def get_max_length(self) -> int:
        return self.slots.width


class RegionCache(Cache):
    """A cache of `RegionLayer`s sharing one write plan: where each row's next query block goes."""

    def __init__(self, num_layers: int, width: int, active: int) -> None:
        self.width = width
        self.batch = active  # rows allocated
        self.active = active  # rows 0 .. active-1 hold the batch's unfinished sequences
        self.rows: torch.Tensor | None = None  # prefill: the rows one forward fills (else a step)
        self.prefill_start = 0  # prefill: the first slot it fills (a chunk after the first: > 0)
        self.write_at: torch.Tensor | None = None  # [B, q] slot of each query token, set per forward
        # RegionCache a step's attention reads, set per forward: the prefix up to the last query slot of
        # any row, rounded up to SPAN_STEP. RegionCache past every row's block hold nothing any row may
        # see, so reading them only costs time (a region is as wide as the longest prompt plus
        # every new token); the rounding keeps the shapes few (static shapes for CUDA graphs).
        self.span = width
        super().__init__(layers=[RegionLayer(self) for _ in range(num_layers)])

    def write_index(self, shape: torch.Size) -> torch.Tensor:
        """`write_at` as a scatter index for keys or values of `shape` [B, H, q, D]."""
        batch, heads, q, dim = shape
        return self.write_at[:, None, :, None].expand(batch, heads, q, dim)

    def fill_holes(self, holes: list[int], movers: list[int], used: list[int], active: int) -> None:
        """Copy row `movers[i]` into row `holes[i]` (a finished one), then run on the first `active` rows.

        Only the `used[i]` slots the mover attends are copied: the slots past a row's length are
        never read before its next query block overwrites them, so the copy costs the row's tokens,
        not the region's width (set by the batch's longest prompt).
        """
        for hole, mover, n in zip(holes, movers, used):
            for layer in self.layers:
                if layer.is_initialized:
                    layer.keys[hole, :, :n] = layer.keys[mover, :, :n]
                    layer.values[hole, :, :n] = layer.values[mover, :, :n]
        self.active = active


@dataclass
class RegionState(KVState):
    """A `KVState` over fixed regions: `mask` [B, width (+ tokens fed this step)] describes them.

    `lengths` [B]: slots each row attends (its committed tokens but the pending one). Between steps
    the mask is `1^lengths 0^rest` over the region; each forward appends its query columns to it,
    like the left-padded state's mask, so the engine's phases and the recorder read it unchanged.
    """

    lengths: torch.Tensor | None = None
    # max(lengths), kept on the host: each forward needs it (the span, the overflow check), and
    # reading it off the device would wait for the GPU once per forward, k + 1 times a step.
    longest: int = 0
    # [B, width] the between-steps mask, kept apart from `mask` (which each forward extends into a
    # new tensor the recorder reads): the next settle marks the slots a row kept in it, in place.
    region: torch.Tensor | None = None
    # [B] bool: each row's query block of the last 4-D mask fed was causal (what the recorder reports).
    query_causal: torch.Tensor | None = None

    def feed_own(
        self,
        model: Any,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        query_mask: torch.Tensor | None = None,
        query_attend: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Write the query block at each row's length (plus what this step already fed), attend up to it."""
        batch, q = input_ids.shape
        slots: RegionCache = self.cache
        fed_this_step = self.mask.shape[1] - slots.width
        start = self.lengths + fed_this_step  # [B] first slot of this block
        query_slots = start[:, None] + torch.arange(q, device=start.device)  # [B, q]
        last = self.longest + fed_this_step + q - 1  # = query_slots.max(), known without a sync
        if last >= slots.width:
            raise SpecvizError(f"inplace: a row outgrew its {slots.width} slots (engine bug)")
        slots.write_at = query_slots
        slots.span = min(slots.width, -(-(last + 1) // SPAN_STEP) * SPAN_STEP)
        mask = block_mask(query_slots, slots.span, model.dtype, query_attend)
        self.query_causal = query_block_causal(mask, query_slots)
        self.query_attends = None if query_attend is None else query_block_attends(mask, query_slots)
        out = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            cache=slots,
            use_cache=True,
        )
        if query_mask is None:
            query_mask = torch.ones(batch, q, dtype=self.mask.dtype, device=self.mask.device)
        self.mask = torch.cat([self.mask, query_mask], dim=1)
        return out.logits


def block_mask(
    query_slots: torch.Tensor, width: int, dtype: torch.dtype, query_attend: torch.Tensor | None = None
) -> torch.Tensor:
    """Additive 4-D mask [B, 1, q, width]: query j sees slots 0 .. query_slots[:, j] (0 or -inf).

    Additive rather than boolean so eager attention (which adds the mask) and SDPA read it alike.
    `query_attend` [q, q] bool (a tree; [B, q, q]: a tree per row): query i sees the slots before
    its block and the block's query slots j it allows, not the block causally.
    """
    visible = torch.arange(width, device=query_slots.device)[None, None, :] <= query_slots[:, :, None]
    if query_attend is not None:
        visible = torch.arange(width, device=query_slots.device)[None, None, :] < query_slots[:, :1, None]
        visible = visible.expand(-1, query_slots.shape[1], -1).clone()  # [B, q, width]: the committed slots
        q = query_slots.shape[1]
        index = query_slots[:, None, :].expand(-1, q, -1)  # [B, q, q]
        block = query_attend if query_attend.dim() == 3 else query_attend[None].expand(query_slots.shape[0], q, q)
        visible.scatter_(2, index, block)
    mask = torch.zeros(visible.shape, dtype=dtype, device=query_slots.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[:, None]


def query_block_causal(mask: torch.Tensor, query_slots: torch.Tensor) -> torch.Tensor:
    """[B] bool: query i of each row sees query slot j exactly when j <= i (read off the mask fed)."""
    q = query_slots.shape[1]
    index = query_slots[:, None, :].expand(-1, q, -1)  # [B, q, q]: query j's slot, for every query i
    sees = mask[:, 0].gather(2, index) == 0  # additive mask: 0 = visible
    causal = torch.ones(q, q, dtype=torch.bool, device=mask.device).tril()
    return (sees == causal).all(2).all(1)


def query_block_attends(mask: torch.Tensor, query_slots: torch.Tensor) -> torch.Tensor:
    """[B, q, q] bool: query i of each row sees query slot j (read off the mask fed)."""
    q = query_slots.shape[1]
    index = query_slots[:, None, :].expand(-1, q, -1)
    return mask[:, 0].gather(2, index) == 0


def region_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """The between-steps mask of a fixed-slot state: the first `lengths` slots of each region."""
    return (torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]).long()


def settled(
    slots: RegionCache, lengths: torch.Tensor, next_pos: torch.Tensor, longest: int, region: torch.Tensor | None = None
) -> RegionState:
    """The state between steps: each region's first `lengths` slots attended, nothing else;
    `longest` is max(lengths), on the host.

    `region`: that mask when the caller already has it (`apply_plan` updates the last one in place).
    """
    if region is None:
        region = region_mask(lengths, slots.width)
    return RegionState(cache=slots, mask=region, next_pos=next_pos, lengths=lengths, region=region, longest=longest)


def new_order(rows: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Where the continuing `rows` (ascending) go so they fill a prefix: each finished row inside
    the prefix takes the next continuing row from past it. Returns (old row of each new row,
    holes, movers): the rows to copy to and from."""
    keep, continuing = len(rows), set(rows)
    holes = [r for r in range(keep) if r not in continuing]
    movers = [r for r in rows if r >= keep]
    order = list(range(keep))
    for hole, mover in zip(holes, movers):
        order[hole] = mover
    return order, holes, movers


def apply_plan(
    state: RegionState, order: list[int], holes: list[int], movers: list[int], plan: CachePlan
) -> RegionState:
    """Carry out a cache plan without moving a slot: each kept row's length grows by what it kept.

    The plan's `attend` covers [region | this step's block]: the region's attended slots plus the
    block's kept prefix (accepted drafts + 1), which already sit right after them, so a row's new
    length is its old one plus what the plan attends of the block. (A plan that dropped region
    slots has no fixed-slot form; the method refuses the faults that make one.) Finished rows
    leave: continuing rows past the new prefix are copied into their places (`new_order`).
    The region mask is updated in place, a few columns per row, not rebuilt over its width.
    """
    width = state.cache.width
    old, region, next_pos = state.lengths, state.region, plan.next_pos
    if plan.scattered:
        gather_block(state.cache, old, plan.attend[:, width:])
    grown = old + plan.attend[:, width:].sum(1)
    finished = len(order) != state.batch_size  # rows finished: keep `order`, fill the holes it leaves
    if finished:
        index = torch.tensor(order, dtype=torch.long, device=next_pos.device)
        old, grown, region, next_pos = (t.index_select(0, index) for t in (old, grown, region, next_pos))
    lengths = grown.tolist()  # one read per step, after the commit has waited for this step anyway
    if finished:  # a hole's new length is its mover's
        state.cache.fill_holes(holes, movers, [lengths[h] for h in holes], len(order))
    mark_attended(region, old, grown, plan.attend.shape[1] - width)
    return settled(state.cache, grown, next_pos, max(lengths, default=0), region)


def gather_block(slots: RegionCache, start: torch.Tensor, keep: torch.Tensor) -> None:
    """Move each row's kept block slots (`keep` [B, block] bool, from slot `start`) to the front of
    its block, in order: a tree's accepted path was written among rejected nodes."""
    block = keep.shape[1]
    order = (~keep).long().argsort(dim=1, stable=True)  # kept slots first, in slot order
    src = start[:, None] + order  # [B, block]
    dst = start[:, None] + torch.arange(block, device=start.device)[None, :]
    rows = keep.shape[0]
    for layer in slots.layers:
        if not layer.is_initialized:
            continue
        for tensor in (layer.keys, layer.values):
            view = tensor[:rows]
            index = src[:, None, :, None].expand(-1, view.shape[1], -1, view.shape[3])
            moved = view.gather(2, index)
            view.scatter_(2, dst[:, None, :, None].expand_as(index), moved)


def mark_attended(region: torch.Tensor, start: torch.Tensor, end: torch.Tensor, block: int) -> None:
    """Set slots start .. end-1 of each row of `region` (at most `block` of them) to attended."""
    slots = start[:, None] + torch.arange(block, device=region.device)  # < width: feed_own checked
    region.scatter_(1, slots, (slots < end[:, None]).to(region.dtype))  # 0 past end: already 0
