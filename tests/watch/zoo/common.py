"""Pieces the zoo's engines share, written with plain Hugging Face forwards (nothing from specviz).

`HoleCache`: a batched target cache that never moves a slot. Each call appends the query to every
row (ragged queries right-padded, their padding masked out); the slots a row does not keep
(rejected drafts) are masked out afterwards, so rows grow holes instead of being realigned.
`draft_greedy`: n greedy proposals per row from a draft that keeps no cache (it re-reads each
row's whole sequence, left-padded, at every call).
`HoleCache.select` keeps some rows, in a new order (a compacted, reordered batch); `HoleCache.join`
adds another HoleCache's rows (a newcomer prefilled on its own), left-padded to one width.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

PAD = 0


def left_padded(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[PAD] * (width - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    return ids, mask


@torch.no_grad()
def draft_greedy(draft, seqs: list[list[int]], n: int, shift: int = 0) -> list[list[int]]:
    """n greedy drafts per row; `shift` offsets the fed positions (0 is right)."""
    seqs = [list(s) for s in seqs]
    out: list[list[int]] = [[] for _ in seqs]
    for _ in range(n):
        ids, mask = left_padded(seqs)
        positions = (mask.cumsum(1) - 1).clamp(min=0) + shift
        token = draft(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].argmax(-1)
        for r, t in enumerate(token.tolist()):
            out[r].append(t)
            seqs[r].append(t)
    return out


class HoleCache:
    """The target's cache over all rows; row r has `lens[r]` committed tokens cached."""

    def __init__(self, target, seqs: list[list[int]]) -> None:
        self.target = target
        ids, self.mask = left_padded([s[:-1] for s in seqs])  # all but the pending token
        out = target(input_ids=ids, attention_mask=self.mask, position_ids=(self.mask.cumsum(1) - 1).clamp(min=0))
        self.cache = out.past_key_values
        self.lens = [len(s) - 1 for s in seqs]

    @torch.no_grad()
    def forward(self, queries: list[list[int]]) -> torch.Tensor:
        """Logits [B, q, V] of each row's query (an empty query: an idle row, fully masked)."""
        q = max(len(x) for x in queries)
        ids = torch.tensor([x + [PAD] * (q - len(x)) for x in queries])
        qmask = torch.tensor([[1] * len(x) + [0] * (q - len(x)) for x in queries])
        self.mask = torch.cat([self.mask, qmask], 1)
        positions = torch.tensor([[n + i for i in range(q)] for n in self.lens])
        out = self.target(
            input_ids=ids, attention_mask=self.mask, position_ids=positions, past_key_values=self.cache, use_cache=True
        )
        self.cache, self.q = out.past_key_values, q
        return out.logits

    def keep(self, kept: list[int], attended: list[int] | None = None) -> None:
        """Row r keeps the first kept[r] slots of its last query; the rest are masked out (from
        slot attended[r] on, when given: an engine that forgets to mask its rejected drafts)."""
        width = self.mask.shape[1]
        for r, n in enumerate(kept):
            self.mask[r, width - self.q + (n if attended is None else attended[r]) :] = 0
            self.lens[r] += n

    def select(self, rows: list[int]) -> None:
        """Keep these rows, in this order: cache rows, mask rows and lengths move together."""
        self.cache.batch_select_indices(torch.tensor(rows, dtype=torch.long))
        self.mask = self.mask[rows]
        self.lens = [self.lens[r] for r in rows]

    def join(self, other: HoleCache, at: int) -> None:
        """Insert `other`'s rows before row `at`, both left-padded to the wider cache."""
        width = max(self.mask.shape[1], other.mask.shape[1])
        joined = DynamicCache()
        for i, ((k1, v1), (k2, v2)) in enumerate(zip(kv_pairs(self.cache), kv_pairs(other.cache))):
            k1, v1, k2, v2 = (_left_pad(t, width, 2) for t in (k1, v1, k2, v2))
            joined.update(torch.cat([k1[:at], k2, k1[at:]]), torch.cat([v1[:at], v2, v1[at:]]), i)
        m1, m2 = _left_pad(self.mask, width, 1), _left_pad(other.mask, width, 1)
        self.cache, self.mask = joined, torch.cat([m1[:at], m2, m1[at:]])
        self.lens = self.lens[:at] + other.lens + self.lens[at:]


def verify(drafts: list[int], targets: list[int]) -> int:
    """Greedy acceptance: the drafts that agree with the target's argmax."""
    a = 0
    while a < len(drafts) and drafts[a] == targets[a]:
        a += 1
    return a


def kv_pairs(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if hasattr(cache, "layers"):  # transformers 5.x
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] = width - t.shape[dim]
    return torch.cat([t.new_zeros(shape), t], dim)
