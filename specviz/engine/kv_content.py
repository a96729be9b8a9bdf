"""KV-content check: does each attended cache slot hold the key of the token it stands for?

At layer 0 a slot's key is a pure function of its token and its position: embeddings (plus a
learned position embedding, or rotary applied to the key, or nothing for ALiBi), a norm and the
key projection. No other token has mixed in yet. So the expected layer-0 keys of a row can be
recomputed from its committed tokens alone, for any model family, and compared with what the
engine's cache holds at the row's attended slots. A mismatch means the slot holds another row's
KV, a stale KV after a move, or a key written at the wrong position, none of which the mask or the
lengths can show.

Expected keys are computed once per token: committed tokens never change, so each sequence keeps
the keys already computed and each check only runs the tokens committed since the last one, for
all checked rows in one batch, stopping the model after its first decoder layer.
"""

from __future__ import annotations

from typing import Any

import torch

# Largest |actual - expected| per slot, relative to the largest |expected| of the row, that still
# counts as the same key: batched GEMMs of other shapes move fp32 keys by ~1e-6 and bf16 by ~1e-2.
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}


class _StopAfterLayer0(Exception):
    """Raised by a hook on decoder layer 1: layer 0 has written its keys, the rest is not needed."""


def decoder_layers(model: Any) -> torch.nn.ModuleList:
    """The decoder-layer list: the ModuleList as long as the config's layer count (any family)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    count = config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return module
    raise TypeError(f"{type(model).__name__}: no ModuleList of {count} decoder layers")


def _raise_stop(module: Any, args: Any, kwargs: Any) -> None:
    raise _StopAfterLayer0


@torch.no_grad()
def layer0_keys(model: Any, tokens: list[list[int]], starts: list[int], pad_id: int) -> list[torch.Tensor]:
    """Layer-0 keys [H, len, D] of each row's `tokens`, fed at positions starts[i], starts[i] + 1, ...

    Rows are left-padded into one batch; layer-0 keys do not depend on other tokens, so the
    padding and the missing context change nothing.
    """
    from transformers import DynamicCache

    device = next(model.parameters()).device
    width = max(len(t) for t in tokens)
    ids = torch.full((len(tokens), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros(len(tokens), width, dtype=torch.long, device=device)
    positions = torch.zeros(len(tokens), width, dtype=torch.long, device=device)
    for row, (toks, start) in enumerate(zip(tokens, starts)):
        if toks:
            ids[row, width - len(toks) :] = torch.tensor(toks, device=device)
            mask[row, width - len(toks) :] = 1
            positions[row, width - len(toks) :] = torch.arange(start, start + len(toks), device=device)
    cache = DynamicCache(config=model.config)
    layers = decoder_layers(model)
    hook = layers[1].register_forward_pre_hook(_raise_stop, with_kwargs=True) if len(layers) > 1 else None
    try:
        model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
    except _StopAfterLayer0:
        pass
    finally:
        if hook is not None:
            hook.remove()
    keys = cache.layers[0].keys
    return [keys[row, :, width - len(toks) :] for row, toks in enumerate(tokens)]


class KVContentChecker:
    """Expected layer-0 keys per sequence, extended as tokens are committed."""

    def __init__(self, model: Any, pad_id: int) -> None:
        self.model = model
        self.pad_id = pad_id
        self.expected: dict[int, torch.Tensor] = {}  # seq_id -> [H, m, D] keys of its first m tokens

    def first_mismatches(self, cache: Any, mask: torch.Tensor, contexts: dict[int, list[int]]) -> list[int | None]:
        """Per row (`contexts`: seq_id -> tokens its cache should hold, in row order): first bad slot.

        A slot is bad when its key differs from the expected one beyond the dtype's tolerance, or
        when the row attends more slots than it has tokens (the first extra slot). Fewer attended
        slots are left to the KV-length check.
        """
        self._extend(contexts)
        keys = cache.layers[0].keys if cache is not None else None
        out: list[int | None] = []
        for row, (seq_id, tokens) in enumerate(contexts.items()):
            slots = mask[row].nonzero().flatten()
            expected = self.expected.get(seq_id)  # None: no token to hold yet (one-token prompt)
            out.append(self._first_bad(keys, row, slots, None if expected is None else expected[:, : len(tokens)]))
        return out

    def forget(self, seq_id: int) -> None:
        self.expected.pop(seq_id, None)

    def _extend(self, contexts: dict[int, list[int]]) -> None:
        """Compute the keys of tokens committed since the last check, for all rows at once."""
        todo = {}
        for seq_id, tokens in contexts.items():
            have = self.expected[seq_id].shape[1] if seq_id in self.expected else 0
            if len(tokens) > have:
                todo[seq_id] = (have, tokens[have:])
        if not todo:
            return
        new = layer0_keys(self.model, [t for _, t in todo.values()], [s for s, _ in todo.values()], self.pad_id)
        for seq_id, keys in zip(todo, new):
            old = self.expected.get(seq_id)
            self.expected[seq_id] = keys if old is None else torch.cat([old, keys], dim=1)

    def _first_bad(
        self, keys: torch.Tensor | None, row: int, slots: torch.Tensor, expected: torch.Tensor | None
    ) -> int | None:
        if keys is None or len(slots) == 0:
            return None
        common = 0 if expected is None else min(len(slots), expected.shape[1])
        if common:
            actual = keys[row, :, slots[:common]].float()
            wanted = expected[:, :common].float()
            scale = wanted.abs().amax().clamp(min=1e-6)
            error = (actual - wanted).abs().amax(dim=(0, 2)) / scale  # per slot
            bad = (error > TOLERANCE.get(keys.dtype, 1e-3)).nonzero().flatten()
            if len(bad):
                return int(slots[bad[0]])
        return int(slots[common]) if len(slots) > common else None
