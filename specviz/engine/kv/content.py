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
all checked rows in one packed batch, stopping the model as soon as layer 0 hands over its keys.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

# Largest |actual - expected| per slot, relative to the largest |expected| of the row, that still
# counts as the same key: batched GEMMs of other shapes move fp32 keys by ~1e-6 and bf16 by ~1e-2.
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}


class _StopAfterLayer0(Exception):
    """Raised by `_KeyCapture` once layer 0 has handed over its keys: nothing after them is needed."""


class _KeyCapture(DynamicCache):
    """A cache that keeps the keys layer 0 writes and stops the forward right there.

    Every family hands its attention's keys (after norm, projection and rotary) to the cache's
    `update` before it attends, so stopping there skips layer 0's attention and MLP and all later
    layers: the cost is the embeddings and the key projection of the tokens, not a prefill.
    """

    layer0: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        if layer_idx != 0:  # layer 0 holds no KV (a recurrent or linear-attention layer first)
            raise TypeError("the KV-content check needs an attention layer first (layer 0 wrote no keys)")
        self.layer0 = key_states
        raise _StopAfterLayer0


# Tokens per row of the packed batch the expected keys are computed in: rows of equal length, so
# one long sequence among short ones costs its own tokens, not a batch padded to its length.
PACK_LEN = 256


@torch.no_grad()
def layer0_keys(model: Any, tokens: list[list[int]], starts: list[int], pad_id: int) -> list[torch.Tensor]:
    """Layer-0 keys [H, len, D] of each row's `tokens`, fed at positions starts[i], starts[i] + 1, ...

    A layer-0 key depends on its token and its position only, so the tokens of all rows are laid
    end to end with their own positions and cut into rows of `PACK_LEN` (the last one padded and
    masked): no padding to the longest sequence, and no other token can change a key.
    """
    device = next(model.parameters()).device
    flat_ids = [t for toks in tokens for t in toks]
    flat_pos = [p for toks, start in zip(tokens, starts) for p in range(start, start + len(toks))]
    total = len(flat_ids)
    if total == 0:
        return [torch.empty(0) for _ in tokens]
    pack = min(PACK_LEN, total)
    rows = -(-total // pack)
    ids = torch.full((rows * pack,), pad_id, dtype=torch.long, device=device)
    positions = torch.zeros(rows * pack, dtype=torch.long, device=device)
    mask = torch.zeros(rows * pack, dtype=torch.long, device=device)
    ids[:total] = torch.tensor(flat_ids, device=device)
    positions[:total] = torch.tensor(flat_pos, device=device)
    mask[:total] = 1
    cache = _KeyCapture(config=model.config)
    try:
        model(
            input_ids=ids.view(rows, pack),
            attention_mask=mask.view(rows, pack),
            position_ids=positions.view(rows, pack),
            cache=cache,
            use_cache=True,
        )
    except _StopAfterLayer0:
        pass
    if cache.layer0 is None:
        raise TypeError(f"{type(model).__name__}: layer 0 handed no keys to the cache")
    heads, dim = cache.layer0.shape[1], cache.layer0.shape[3]
    flat_keys = cache.layer0.transpose(1, 2).reshape(rows * pack, heads, dim)[:total]  # [tokens, H, D]
    out, offset = [], 0
    for toks in tokens:
        out.append(flat_keys[offset : offset + len(toks)].transpose(0, 1))
        offset += len(toks)
    return out


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
        self.extend(contexts)
        keys = cache.layers[0].keys if cache is not None else None
        out: list[int | None] = []
        for row, (seq_id, tokens) in enumerate(contexts.items()):
            slots = mask[row].nonzero().flatten()
            out.append(self._first_bad(keys, row, slots, self.expected_of(seq_id, len(tokens))))
        return out

    def expected_of(self, seq_id: int, count: int) -> torch.Tensor | None:
        """The expected keys [H, count, D] of the sequence's first `count` tokens (`extend` first);
        None: no token to hold yet (a one-token prompt)."""
        expected = self.expected.get(seq_id)
        return None if expected is None else expected[:, :count]

    def first_bad_slot(self, keys: torch.Tensor, slots: list[int], seq_id: int, count: int) -> int | None:
        """One row's first bad slot (as `first_mismatches`), its layer-0 keys [H, slots, D] copied earlier."""
        attended = torch.tensor(slots, dtype=torch.long, device=keys.device)
        return self._first_bad(keys[None], 0, attended, self.expected_of(seq_id, count))

    def forget(self, seq_id: int) -> None:
        self.expected.pop(seq_id, None)

    def extend(self, contexts: dict[int, list[int]]) -> None:
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
