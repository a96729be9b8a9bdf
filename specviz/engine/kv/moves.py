"""KV moves: rebuild a batch's caches after a step, in one batched gather per layer and tensor.

`compact` keeps some rows and, in each, the slots a `CachePlan` retains, left-padded anew (EQSPEC's
realignment); `stack` and `split` turn single-row states into a left-padded batch and back.
`compact_per_row_loop` is the reference implementation's per-row loop, for the benchmarks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from specviz.engine.kv.headroom import HeadroomLayer, adopt, storage
from specviz.engine.kv.state import CachePlan, KVState, cache_layers, leading_zeros

# compact's signature: (state, rows, retain, attend, next_pos) -> the rebuilt state
KVMove = Callable[..., KVState]


def compact(
    state: KVState,
    rows: torch.Tensor,
    retain: torch.Tensor,
    attend: torch.Tensor,
    next_pos: torch.Tensor,
) -> KVState:
    """The batched KV move: keep `rows`, and in each the `retain`ed slots, left-padded anew.

    `retain` [B, W] says which slots survive (in order); `attend` [B, W] which of those the
    mask marks real. New width = the longest surviving row. One flat index_select per layer
    and tensor, no Python loop over rows; none at all when nothing moves.
    """
    retain = retain[rows]
    attend = attend[rows]
    batch, width = retain.shape
    device = retain.device
    counts = retain.sum(1)
    new_width = int(counts.max()) if counts.numel() else 0
    pad = new_width - counts
    # Each retained slot's new index: the row's new padding plus the retained slots before it
    # (a cumulative sum, no sort); dropped slots go to a spare column past the new width.
    dest = torch.where(retain, retain.cumsum(1) - 1 + pad[:, None], new_width)
    src = torch.zeros(batch, new_width + 1, dtype=torch.long, device=device)
    src.scatter_(1, dest, torch.arange(width, device=device).expand(batch, width))
    src = src[:, :new_width]  # padding slots read slot 0: masked, and finite
    real = torch.arange(new_width, device=device)[None, :] >= pad[:, None]
    new_mask = (attend.gather(1, src) & real).long()
    if state.cache is None or new_width == 0:
        return KVState(cache=None, mask=new_mask, next_pos=next_pos)
    if _is_identity(rows, src, real, state.batch_size, width):
        return KVState(cache=state.cache, mask=new_mask, next_pos=next_pos)  # every slot stays put
    gather = HeadroomGather(rows, src)
    for layer in cache_layers(state.cache):
        keys, values = storage(layer)
        headroom = layer.headroom if isinstance(layer, HeadroomLayer) else 0
        adopt(layer, gather(keys, headroom), gather(values, headroom), new_width)
    return KVState(cache=state.cache, mask=new_mask, next_pos=next_pos)


class HeadroomGather:
    """Row `rows[i]`'s slots `src[i]` of a [B, H, W, D] tensor, as [B', H, width + headroom, D] in one
    flat index_select; the `headroom` slots past the width are scratch (a `HeadroomLayer` writes the next
    forward's slots there). Indices are built once per source width and headroom, shared by layers."""

    def __init__(self, rows: torch.Tensor, src: torch.Tensor) -> None:
        self.rows, self.src = rows, src
        self.indices: dict[tuple[int, int, int], torch.Tensor] = {}

    def __call__(self, tensor: torch.Tensor, headroom: int) -> torch.Tensor:
        _, heads, width, dim = tensor.shape
        index = self.indices.get((heads, width, headroom))
        if index is None:
            src = torch.nn.functional.pad(self.src, (0, headroom)) if headroom else self.src  # scratch: slot 0
            index = self.indices[(heads, width, headroom)] = flat_index(self.rows, src, heads, width)
        shape = (len(self.rows), heads, self.src.shape[1] + headroom, dim)
        return tensor.view(-1, dim).index_select(0, index).view(shape)


def rebuild(state: KVState, rows: torch.Tensor, plan: CachePlan, move: KVMove = compact) -> KVState:
    """Apply `plan` to `state`, keeping only `rows`; `move` is `compact` or a drop-in with its signature."""
    return move(state, rows, plan.retain, plan.attend, plan.next_pos[rows])


def _is_identity(rows: torch.Tensor, src: torch.Tensor, real: torch.Tensor, batch: int, width: int) -> bool:
    """No row leaves and every real slot keeps its index (plain batched greedy, all-accept steps)."""
    if len(rows) != batch or src.shape[1] != width:
        return False
    same_rows = bool((rows == torch.arange(batch, device=rows.device)).all())
    slots = torch.arange(width, device=src.device)[None, :]
    return same_rows and bool(((src == slots) | ~real).all())


def flat_index(rows: torch.Tensor, src: torch.Tensor, heads: int, width: int) -> torch.Tensor:
    """Row numbers into the [B*H*W, D] view of a cache tensor: (rows[i], every head, src[i]), for
    one index_select or index_copy_ (the moves here and the pool's gathers and stores).

    On CPU one flat index_select beats index_select + gather by several times (benchmarks/kv_move.py).
    """
    head_ids = torch.arange(heads, device=src.device)
    first = (rows[:, None] * heads + head_ids[None, :]) * width  # [B', H]: flat row of (row, head, slot 0)
    return (first[:, :, None] + src[:, None, :]).reshape(-1)


def compact_per_row_loop(
    state: KVState,
    rows: torch.Tensor,
    retain: torch.Tensor,
    attend: torch.Tensor,
    next_pos: torch.Tensor,
) -> KVState:
    """The reference implementation's way (a Python loop per row and layer). Benchmarks only."""
    rows_list = rows.tolist()
    kept = [retain[r].nonzero().flatten() for r in rows_list]
    new_width = max((len(k) for k in kept), default=0)
    new_mask = torch.zeros(len(rows_list), new_width, dtype=torch.long, device=state.mask.device)
    for i, (r, idx) in enumerate(zip(rows_list, kept)):
        new_mask[i, new_width - len(idx) :] = attend[r, idx].long()
    if state.cache is not None:
        for layer in cache_layers(state.cache):
            for name in ("keys", "values"):
                old = getattr(layer, name)
                new = old.new_zeros(len(rows_list), old.shape[1], new_width, old.shape[3])
                for i, (r, idx) in enumerate(zip(rows_list, kept)):
                    new[i, :, new_width - len(idx) :] = old[r, :, idx]
                setattr(layer, name, new)
    return KVState(cache=state.cache, mask=new_mask, next_pos=next_pos)


def stack(states: list[KVState], cache_factory: Any) -> KVState:
    """Stack single-row states into one batch, left-padding shorter rows (no-op if equal)."""
    width = max(s.width for s in states)
    masks = [torch.nn.functional.pad(s.mask, (width - s.width, 0)) for s in states]
    next_pos = torch.cat([s.next_pos for s in states])
    caches = [s.cache for s in states]
    if all(c is None for c in caches) or width == 0:
        return KVState(cache=None, mask=torch.cat(masks), next_pos=next_pos)
    shape_source = cache_layers(next(c for c in caches if c is not None))
    layer_lists = [cache_layers(c) if c is not None else None for c in caches]
    new_cache = cache_factory()
    for layer_idx, like in enumerate(shape_source):
        keys = [_row_slots(layers, layer_idx, "keys", like.keys, width) for layers in layer_lists]
        values = [_row_slots(layers, layer_idx, "values", like.values, width) for layers in layer_lists]
        new_cache.update(torch.cat(keys), torch.cat(values), layer_idx)
    return KVState(cache=new_cache, mask=torch.cat(masks), next_pos=next_pos)


def _row_slots(layers: list[Any] | None, idx: int, name: str, like: torch.Tensor, width: int) -> torch.Tensor:
    """One row's keys or values, left-padded to `width` (all padding for an empty cache)."""
    if layers is None:
        return like.new_zeros(1, like.shape[1], width, like.shape[3])
    return _left_pad(getattr(layers[idx], name), width)


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - tensor.shape[2]
    return torch.nn.functional.pad(tensor, (0, 0, missing, 0)) if missing else tensor


def split(state: KVState, cache_factory: Any) -> list[KVState]:
    """One single-row state per batch row, each trimmed of the batch's leading padding."""
    pads = leading_zeros(state.mask).tolist()
    layers = cache_layers(state.cache) if state.cache is not None else []
    out = []
    for row, pad in enumerate(pads):
        cache = None
        if layers and state.width - pad > 0:
            cache = cache_factory()
            for layer_idx, layer in enumerate(layers):
                cache.update(layer.keys[row : row + 1, :, pad:], layer.values[row : row + 1, :, pad:], layer_idx)
        out.append(KVState(cache=cache, mask=state.mask[row : row + 1, pad:], next_pos=state.next_pos[row : row + 1]))
    return out
