"""What a watched target's cache holds, not only how much of it a row attends: a roll, gather or
index-select gone wrong leaves masks, lengths and positions right while a slot holds another token's
key. Layer-0 keys are a function of token and position alone (`engine.kv.content`), so the hooks
copy each padded call's layer-0 keys before it runs (`KeyCopies`, within a byte budget) and `close`
compares every row's attended slots with the keys of the tokens its sequence committed
(`check_content`): `kv_content_checked`, and `kv_mismatch_slot` where one differs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specviz.engine.kv.content import KVContentChecker
from specviz.trace.mask_runs import expand_mask
from specviz.trace.schema import RowRecord

KEY_BUDGET = 256 * 2**20  # bytes of layer-0 keys kept per watch: the first calls of a long run


def layer0_keys_of(cache: Any) -> torch.Tensor | None:
    """A transformers cache's layer-0 keys [B, H, slots, D] (its `layers`, or an older `key_cache`)."""
    layers = getattr(cache, "layers", None) or ()
    keys = getattr(layers[0], "keys", None) if layers else (getattr(cache, "key_cache", None) or [None])[0]
    return keys if isinstance(keys, torch.Tensor) and keys.dim() == 4 else None


class KeyCopies:
    """Copies of the layer-0 keys a target's padded calls were fed, while the budget lasts."""

    def __init__(self, budget: int = KEY_BUDGET) -> None:
        self.left = budget  # bytes left: a call past them is not copied, and its rows not checked

    def __call__(self, cache: Any, width: int, batch: int) -> torch.Tensor | None:
        """The keys of the call's `width` cache slots [B, H, width, D], or None: no cache, or one that
        holds more slots than it counts (a static or in-place cache's slots are not its count)."""
        keys = layer0_keys_of(cache)
        if keys is None or not width or keys.shape[0] != batch or keys.shape[2] != width:
            return None
        size = batch * keys.shape[1] * width * keys.shape[3] * keys.element_size()
        if size > self.left:
            return None
        self.left -= size
        return keys[:, :, :width].clone()


@dataclass(frozen=True)
class ContentCheck:
    """One step row whose call's keys were copied: what its attended cache slots should hold."""

    row: RowRecord  # its `mask_rle` says which slots it attends
    keys: torch.Tensor | None  # [H, width, D]: the row's layer-0 keys before the call (None: not copied)
    tokens: list[int]  # the sequence's committed tokens before its pending one


def check_content(model: Any, checks: list[ContentCheck]) -> str | None:
    """Set each copied row's `kv_content_checked` and `kv_mismatch_slot`; a note where the model's
    layer 0 cannot say its keys, or where some rows over a cache were checked and others not."""
    copied = [check for check in checks if check.keys is not None]
    if not copied:
        return None  # (the check's own skip note says so)
    checker = KVContentChecker(model, pad_id=0)
    longest: dict[int, list[int]] = {}
    for check in copied:
        if len(check.tokens) > len(longest.get(check.row.seq_id, ())):
            longest[check.row.seq_id] = check.tokens
    try:
        checker.extend(longest)  # one pass of each sequence's tokens
    except (TypeError, ValueError, RuntimeError) as why:  # a layer 0 that writes no keys, a model that
        return f"KV content not checked: {why}"  # refuses the call: the trace is written, with the note
    for check in copied:
        slots = attended_cache_slots(check.row.mask_rle, check.keys.shape[1])
        check.row.kv_content_checked = True
        check.row.kv_mismatch_slot = checker.first_bad_slot(check.keys, slots, check.row.seq_id, len(check.tokens))
    if len(copied) == len(checks):
        return None
    return (
        f"KV content checked on {len(copied)} of {len(checks)} rows over a cache (the others' calls: past"
        f" the {KEY_BUDGET >> 20} MiB of layer-0 keys copied, packed, or a cache of another layout)"
    )


def attended_cache_slots(mask_rle: list[list[int]], width: int) -> list[int]:
    """The cache slots (below `width`) a run-length coded mask row attends."""
    return [slot for slot, value in enumerate(expand_mask(mask_rle, width)) if value]
