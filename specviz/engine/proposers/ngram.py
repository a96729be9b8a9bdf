"""Prompt lookup (n-gram) drafting: copy what followed the row's latest n-gram earlier in its own
text. No model and no cache: the cheapest proposer, strong on repetitive text (code, quotes,
summaries), as in vLLM's `ngram` method and transformers' `prompt_lookup_num_tokens`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from specviz.engine.proposers.base import EngineView, NoCarry, Proposals, TreeShape

if TYPE_CHECKING:
    from specviz.engine.batch import Batch
    from specviz.engine.rules import SampleKeys

MAX_NGRAM = 3  # longest suffix looked up; shorter ones are tried when it has no earlier match


def lookup(tokens: list[int], k: int, matches: int = 2) -> list[list[int]]:
    """Up to `matches` continuations (k tokens or fewer) of the longest suffix n-gram (n <= MAX_NGRAM)
    that occurs earlier in `tokens`, latest occurrence first."""
    for n in range(min(MAX_NGRAM, len(tokens) - 1), 0, -1):
        suffix = tokens[-n:]
        found: list[list[int]] = []
        for start in range(len(tokens) - n - 1, -1, -1):  # latest earlier occurrence first
            if tokens[start : start + n] == suffix:
                found.append(tokens[start + n : start + n + k])
                if len(found) == matches:
                    break
        if found:
            return found
    return []


class NgramProposer(NoCarry):
    """k tokens per row from the row's own committed tokens; rows without a match propose the
    pad token (verification rejects it; the step still yields the target's bonus)."""

    name = "ngram"
    cache_model = None

    @classmethod
    def for_run(cls, pair: Any, config: Any) -> NgramProposer:
        return cls()

    def propose(
        self, engine: EngineView, batch: Batch, pending: torch.Tensor, keys: SampleKeys | None, branches: int
    ) -> Proposals:
        started = engine.now()
        k, pad = engine.k, engine.config.pad_id
        main, alts = [], []
        for seq in batch.seqs:
            found = lookup(seq.prompt_ids + seq.output_ids, k)
            first = found[0] if found else []
            main.append(first + [pad] * (k - len(first)))
            second = found[1] if len(found) > 1 else []
            # The alternative at depth d: the second match's token there, if it differs from the first's.
            alt = [second[d] if d < len(second) and second[d] != main[-1][d] else pad for d in range(branches)]
            alts.append(alt)
        device = pending.device
        tokens = torch.tensor(main, dtype=torch.long, device=device).reshape(len(main), k)
        committed = torch.tensor([s.committed for s in batch.seqs], device=device)
        return Proposals(
            tokens=tokens,
            positions=committed[:, None] + torch.arange(k, device=device)[None, :],  # logical index of each draft
            kv_len=None,
            cache_width=0,
            seconds=engine.now() - started,
            alternatives=torch.tensor(alts, dtype=torch.long, device=device).reshape(len(alts), branches)
            if branches
            else None,
            tree=TreeShape(k, branches) if branches else None,
        )
