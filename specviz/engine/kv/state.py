"""Ragged KV state: a Hugging Face cache plus the two things HF would otherwise infer for us.

Every row of a batch keeps, explicitly:
- `mask` [B, W]: which of the W physical cache slots the row may attend (1) and which are padding
  or holes (0). It is the attention mask we feed, never re-derived from token IDs;
- `next_pos` [B]: the position ID the row's next fed token gets.

A correct engine keeps `mask == 0^pad 1^(n-1)` and `next_pos == n-1` for a row with n committed
tokens (the last one, the *pending* token, has no KV yet). Faults break exactly these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specviz.engine.kv.window import full_cache, uses_window_masks, window_masks
from specviz.errors import SpecvizError


@dataclass
class KVState:
    cache: Any | None  # transformers Cache (DynamicCache); None while no slot has been written
    mask: torch.Tensor  # [B, W] long
    next_pos: torch.Tensor  # [B] long
    # [B, q, q] bool, after a forward fed a tree mask: which query slots each query slot attended
    # (read off the mask built, for the recorder); None after any other forward.
    query_attends: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.mask.shape[0]

    @property
    def width(self) -> int:
        return self.mask.shape[1]


@dataclass(frozen=True)
class CachePlan:
    """How one cache is rebuilt after a verify step: the input to `compact` (or any other move)."""

    retain: torch.Tensor  # [B, W] bool: slots that survive, in order
    attend: torch.Tensor  # [B, W] bool: of those, the ones the mask marks real
    next_pos: torch.Tensor  # [B] the position ID each row's next fed token gets
    # The kept new slots are not a prefix of the written ones (a tree's accepted path): layouts
    # that keep new slots in place (regions, the pool's fast store) must move them first.
    scattered: bool = False


def leading_zeros(mask: torch.Tensor) -> torch.Tensor:
    """Left padding per row: slots before the first attended one (all of them if none)."""
    seen = mask.cumsum(1) > 0
    return (~seen).sum(1)


def cache_layers(cache: Any) -> list[Any]:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"unsupported cache type {type(cache).__name__}: need a layered Cache")
    return layers


def _sync_sliding(cache: Any, width: int) -> None:
    """Sliding cache layers, left only for models `window.py` cannot mask, fit only within their window.

    (`run` refuses such a model up front when the run could reach its window; this is the guard.)

    Below its window such a layer keeps every slot, like a full layer. But HF sizes its mask from
    the layer's `cumulative_length`, which our slot moves (compact/stack/split) do not update, so
    set it to the physical width before each forward. At or past the window HF would drop slots
    that our mask still counts: refuse instead of decoding garbage.
    """
    for layer in getattr(cache, "layers", None) or []:
        if not getattr(layer, "is_sliding", False):
            continue
        if width >= layer.sliding_window:
            raise SpecvizError(
                f"the cache would reach {width} slots, past the model's sliding window of "
                f"{layer.sliding_window}; the ragged engine supports sliding-window layers only "
                f"within their window (use shorter prompts or fewer new tokens)"
            )
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.cumulative_length = layer.keys.shape[-2]


def feed(
    model: Any,
    state: KVState,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    query_mask: torch.Tensor | None = None,
    query_attend: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run `model` on `input_ids` [B, q] at explicit `positions`; the cache and mask grow by q.

    `query_attend` [q, q] or [B, q, q] bool (tree verification): query i attends query j where set, instead of
    causally; the mask fed is then 4-D (`tree_mask`), and `state.query_attends` records it.

    The 2-D mask we pass covers cache slots plus query slots; HF adds causality from the
    physical slot order, which is right for a contiguous left-padded layout. `query_mask`
    marks padding inside the query (prefill only); decode queries are all real.
    A state of another layout (regions.py's fixed regions) writes its own slots: `feed_own`.
    """
    own_feed = getattr(state, "feed_own", None)
    if own_feed is not None:
        return own_feed(model, input_ids, positions, query_mask, query_attend)
    batch, q = input_ids.shape
    if query_mask is None:
        query_mask = torch.ones(batch, q, dtype=state.mask.dtype, device=state.mask.device)
    fed_mask = torch.cat([state.mask, query_mask], dim=1)
    attention: Any = fed_mask
    state.query_attends = None
    if query_attend is not None:
        if uses_window_masks(model):
            raise SpecvizError("tree verification does not support sliding-window models yet (use a chain)")
        attention, state.query_attends = tree_mask(state.mask, query_attend, model.dtype)
    elif uses_window_masks(model):  # sliding windows counted per row in logical tokens, on a full cache
        attention = window_masks(model, fed_mask, q)
        if state.cache is None:
            state.cache = full_cache()
    _sync_sliding(state.cache, fed_mask.shape[1])
    out = model(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        cache=state.cache,
        use_cache=True,
    )
    state.cache = out.cache if hasattr(out, "cache") else out.past_key_values
    _sync_sliding(state.cache, fed_mask.shape[1])  # a prefill longer than the window is caught here
    state.mask = fed_mask
    return out.logits


def tree_mask(
    cache_mask: torch.Tensor, query_attend: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive 4-D mask [B, 1, q, W + q] for a tree query block after a cache of W slots: every
    query slot sees the row's attended cache slots and the query slots `query_attend` [q, q] allows;
    plus what it lets each query slot see of the block, [B, q, q] bool."""
    batch, width = cache_mask.shape
    q = query_attend.shape[-1]
    block = query_attend if query_attend.dim() == 3 else query_attend[None].expand(batch, q, q)  # per row, or one
    visible = torch.cat([cache_mask.bool()[:, None, :].expand(batch, q, width), block], dim=2)
    mask = torch.zeros(visible.shape, dtype=dtype, device=cache_mask.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[:, None], block
