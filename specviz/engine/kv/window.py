"""Sliding-window attention in the ragged engine: per-row window masks counted in logical tokens.

At batch 1 a sliding-window layer lets the token at logical index i attend the tokens at
i - window + 1 .. i (Hugging Face's `sliding_window_overlay`: kv_idx > q_idx - window). Hugging
Face's own sliding cache layers drop old slots by physical count, and its masks count physical
slots, both wrong for left-padded ragged rows. So for a windowed model the engine keeps a full
cache (every layer a plain `DynamicLayer`, nothing ever dropped) and passes prepared 4-D masks in
which each row's window is counted in its own attended slots:

- `full_attention`: slot s is visible to query slot t if it is attended and not after t;
- `sliding_attention`: and the row's logical index of t minus that of s is below the window.

Models whose layers mix both kinds take a dict {layer type: 4-D mask} (transformers 5.x); models
with one kind take the 4-D tensor. What cannot be masked this way (flash attention, which takes
no 4-D mask; chunked or other layer kinds; a mixed model without per-type masks) is refused
before any compute by `refusal`, unless the run is short enough that no window is ever reached.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any

import torch

FULL = "full_attention"
SLIDING = "sliding_attention"
_DICT_MARKER = "causal_mask_mapping := attention_mask, dict"  # how 5.x models accept per-type masks
_MASKABLE = ("eager", "sdpa")  # attention implementations that take a prepared 4-D mask


@dataclass(frozen=True)
class WindowSpec:
    """The attention kinds of a model's layers and how its forward accepts masks."""

    window: int | None  # sliding window in tokens; None: no sliding layers
    layer_kinds: frozenset[str]
    takes_dict: bool  # forward accepts {layer type: mask}
    attn_implementation: str

    @property
    def windowed(self) -> bool:
        return self.window is not None

    def problem(self) -> str | None:
        """Why the engine cannot mask this model per row past its window, or None."""
        if not self.windowed:
            return None
        other = self.layer_kinds - {FULL, SLIDING}
        if other:
            return f"layer types {sorted(other)} are not supported"
        if self.attn_implementation not in _MASKABLE:
            return f"attention implementation {self.attn_implementation!r} takes no 4-D mask (use eager or sdpa)"
        if len(self.layer_kinds) > 1 and not self.takes_dict:
            return "its forward does not accept one mask per layer type"
        return None


def window_spec(model: Any) -> WindowSpec:
    """Read (once per model) which layers slide, from its config and its modelling code."""
    cached = getattr(model, "_specviz_window_spec", None)
    if cached is not None:
        return cached
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):  # not a transformers model: no windows
        return WindowSpec(None, frozenset({FULL}), False, "eager")
    config = config.get_text_config(decoder=True)
    kinds = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if kinds is None:
        kinds = [SLIDING if window else FULL]
    kinds = frozenset(kinds)
    if SLIDING not in kinds:
        window = None
    try:
        source = inspect.getsource(sys.modules[type(model).__module__])
    except (OSError, TypeError, KeyError):
        source = ""
    spec = WindowSpec(
        window=int(window) if window else None,
        layer_kinds=kinds,
        takes_dict=_DICT_MARKER in source,
        attn_implementation=str(getattr(config, "_attn_implementation", None) or "eager"),
    )
    model._specviz_window_spec = spec
    return spec


def refusal(model: Any, name: str, longest_context: int) -> str | None:
    """One line saying why a run that reaches `longest_context` physical slots cannot be exact.

    Within its window a sliding layer behaves like a full one, so an unsupported model is still
    fine for runs that never reach it.
    """
    spec = window_spec(model)
    problem = spec.problem()
    if problem is None or longest_context <= spec.window:
        return None
    return (
        f"{name}: sliding window of {spec.window} tokens, and this run reaches {longest_context} "
        f"slots; the ragged engine cannot mask it per row ({problem}); use prompts + "
        f"--max-new-tokens + --draft-k within the window"
    )


def uses_window_masks(model: Any) -> bool:
    spec = window_spec(model)
    return spec.windowed and spec.problem() is None


def full_cache() -> Any:
    """A cache that never drops a slot: every layer a plain DynamicLayer (no config given)."""
    from transformers import DynamicCache

    return DynamicCache()


def window_masks(model: Any, fed_mask: torch.Tensor, query_len: int) -> torch.Tensor | dict[str, torch.Tensor]:
    """Additive 4-D masks [B, 1, q, W + q] for `fed_mask` [B, W + q] whose last q slots are the query.

    Physical order gives causality (the layout is contiguous); each row's logical index of a slot
    is the number of attended slots before it. Every query slot sees itself, so a padded query
    slot (prefill) never has an empty row (its output is discarded).
    """
    spec = window_spec(model)
    batch, total = fed_mask.shape
    device = fed_mask.device
    real = fed_mask.bool()
    logical = fed_mask.long().cumsum(1) - 1  # [B, total]
    slots = torch.arange(total, device=device)
    query_slots = slots[total - query_len :]
    causal = slots[None, :] <= query_slots[:, None]  # [q, total]
    own = slots[None, :] == query_slots[:, None]
    full = (real[:, None, :] & causal[None]) | own[None]  # [B, q, total]
    masks = {FULL: full}
    if spec.window is not None:
        distance = logical[:, total - query_len :, None] - logical[:, None, :]  # [B, q, total]
        masks[SLIDING] = (full & (distance < spec.window)) | own[None]
    dtype = model.dtype if model.dtype.is_floating_point else torch.float32
    floor = torch.finfo(dtype).min
    additive = {
        kind: torch.zeros(batch, 1, query_len, total, dtype=dtype, device=device).masked_fill(~m[:, None], floor)
        for kind, m in masks.items()
    }
    if spec.takes_dict:
        return {kind: additive[kind if kind in additive else FULL] for kind in spec.layer_kinds | {FULL}}
    (only,) = spec.layer_kinds
    return additive[only]
