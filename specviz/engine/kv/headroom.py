"""Cache layers with headroom: a forward writes its new keys and values in place.

transformers' `DynamicLayer.update` concatenates the whole cached tensor with each forward's new
slots, so every forward copies every layer's cache: a step of k draft forwards copies the draft
cache k times, the verify forward the target's once more: a large share of a decode on CPU (measured in
benchmarks/README.md, "Engine modules"). A `HeadroomLayer` keeps each layer's keys and values in a
buffer with headroom (free slots past the cache's width); `update` writes the
new slots there and hands attention a view of the filled part, a copy of q slots, not of the cache.

The KV moves write their result straight into such a buffer (`moves.compact` and the pool's `take`
build their gather index with `headroom` extra slots), so a step of the left-padded methods copies
each cache once (the realignment) instead of once per forward. Code that assigns `layer.keys`
itself (a fault, the reference per-row loop) needs to know nothing of this: a layer whose keys
are no longer its own view adopts them at the next `update`, with one copy, like the concatenation
it replaces.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

# Free slots kept past the width beyond a step's own needs, so that a batch whose slots never move
# (plain batched greedy: the move is skipped) regrows its buffer once per this many tokens.
MIN_HEADROOM = 32


def headroom_for(headroom: int) -> int:
    """The free slots a `HeadroomLayer` asked for `headroom` keeps."""
    return max(headroom, MIN_HEADROOM)


class HeadroomLayer(DynamicLayer):
    """A `DynamicLayer` over a buffer [B, H, capacity, D]; `keys`/`values` view its first `width` slots."""

    def __init__(self, headroom: int) -> None:
        super().__init__()
        self.headroom = headroom_for(headroom)
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None

    def hold(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, width: int) -> None:
        """Take `width` filled slots at the start of these buffers as the layer's cache."""
        self.key_buffer, self.value_buffer = key_buffer, value_buffer
        self.keys, self.values = key_buffer[:, :, :width], value_buffer[:, :, :width]
        self.device = key_buffer.device
        self.is_initialized = True

    def owns_view(self) -> bool:
        """Whether `keys`/`values` are still the views this layer handed out (nobody replaced them)."""
        return (
            self.key_buffer is not None
            and self.keys is not None
            and self.keys.data_ptr() == self.key_buffer.data_ptr()
            and self.values.data_ptr() == self.value_buffer.data_ptr()
            and self.keys.shape[:2] == self.key_buffer.shape[:2]
            and self.keys.stride() == self.key_buffer.stride()
        )

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        width = self.keys.shape[-2] if self.keys.numel() else 0
        new = key_states.shape[-2]
        if not self.owns_view() or width + new > self.key_buffer.shape[-2]:
            self._regrow(key_states, value_states, width, width + new)
        self.key_buffer[:, :, width : width + new].copy_(key_states)
        self.value_buffer[:, :, width : width + new].copy_(value_states)
        self.keys = self.key_buffer[:, :, : width + new]
        self.values = self.value_buffer[:, :, : width + new]
        return self.keys, self.values

    def _regrow(self, key_like: torch.Tensor, value_like: torch.Tensor, width: int, needed: int) -> None:
        """A new buffer with headroom past `needed`, holding the current `width` slots (one copy)."""
        batch, heads, _, dim = key_like.shape
        capacity = needed + max(self.headroom, needed // 8)
        keys = key_like.new_empty(batch, heads, capacity, dim)
        values = value_like.new_empty(batch, value_like.shape[1], capacity, value_like.shape[-1])
        if width:
            keys[:, :, :width].copy_(self.keys)
            values[:, :, :width].copy_(self.values)
        self.key_buffer, self.value_buffer = keys, values

    def reset(self) -> None:
        self.key_buffer = self.value_buffer = None
        super().reset()


def storage(layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The contiguous tensors behind a layer's keys and values, as wide as they are: the buffers of
    a `HeadroomLayer` that still owns its views (slots past the width are unused), else the keys and
    values themselves. Moves index these through a flat [rows * H * width, D] view."""
    if isinstance(layer, HeadroomLayer) and layer.owns_view():
        return layer.key_buffer, layer.value_buffer
    return layer.keys.contiguous(), layer.values.contiguous()


def adopt(layer: Any, keys: torch.Tensor, values: torch.Tensor, width: int) -> None:
    """Give `layer` a move's result: buffers whose first `width` slots are filled (a `HeadroomLayer`
    keeps the rest as headroom; any other layer gets exactly the filled slots)."""
    if isinstance(layer, HeadroomLayer):
        layer.hold(keys, values, width)
    else:
        layer.keys, layer.values = keys[:, :, :width], values[:, :, :width]


def with_headroom(cache: Any, headroom: int) -> Any:
    """Swap `cache`'s plain full-attention layers for `HeadroomLayer`s holding the same slots (one copy).

    Only layers that are exactly `DynamicLayer`: sliding-window and other special layers keep
    their own update rules.
    """
    layers = getattr(cache, "layers", None)
    if not layers:
        return cache
    for i, layer in enumerate(layers):
        if type(layer) is not DynamicLayer or not layer.is_initialized or layer.keys is None:
            continue
        swapped = HeadroomLayer(headroom)
        swapped.lazy_initialization(layer.keys, layer.values)
        width = layer.keys.shape[-2] if layer.keys.numel() else 0
        if width:
            swapped.keys, swapped.values = layer.keys, layer.values
            swapped._regrow(layer.keys, layer.values, width, width)
            swapped.hold(swapped.key_buffer, swapped.value_buffer, width)
        layers[i] = swapped
    return cache
