"""Pieces the zoo's engines share, written with plain Hugging Face forwards (nothing from specviz).

`HoleCache`: a batched target cache that never moves a slot. Each call appends the query to every
row (ragged queries right-padded, their padding masked out); the slots a row does not keep
(rejected drafts) are masked out afterwards, so rows grow holes instead of being realigned.
`draft_greedy`: n greedy proposals per row from a draft that keeps no cache (it re-reads each
row's whole sequence, left-padded, at every call).
"""

from __future__ import annotations

import torch

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


def verify(drafts: list[int], targets: list[int]) -> int:
    """Greedy acceptance: the drafts that agree with the target's argmax."""
    a = 0
    while a < len(drafts) and drafts[a] == targets[a]:
        a += 1
    return a
