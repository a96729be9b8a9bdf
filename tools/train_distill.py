"""The draft's distillation data (the target's greedy continuations of train prefixes) and the
pair's evaluation (speculative acceptance, teacher-forced agreement, held-out loss), for
`tools/train_default_models.py`.

Imported by `tools/train_default_models.py`, which sets OMP_WAIT_POLICY before torch loads.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import PreTrainedModel

from tools.train_common import IGNORE, RunConfig

# --------------------------------------------------------------------------- distillation


@torch.no_grad()
def greedy_generate(model: PreTrainedModel, ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy-decode ``n`` tokens after equal-length prompts ``ids`` [B, T] with a KV cache.

    Returns (generated [B, n], argmax predictions at every prompt position [B, T]).
    EOS is not special: decoding always runs ``n`` steps.
    """
    out = model(input_ids=ids, use_cache=True)
    prompt_preds = out.logits.argmax(-1)
    token = prompt_preds[:, -1:]
    generated = [token]
    for _ in range(n - 1):
        out = model(input_ids=token, cache=out.cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        generated.append(token)
    return torch.cat(generated, dim=1), prompt_preds


def distill_prefixes(docs: list[list[int]], cfg: RunConfig, rng: random.Random) -> list[list[int]]:
    """Prompt-like prefixes of train documents.

    Whole documents mimic how the app prompts the target (a full question);
    random cuts add continuations that start mid-text for variety.
    """
    prefixes = [d for d in docs if d]
    for d in docs:
        for _ in range(cfg.random_cuts_per_doc):
            if len(d) > 2:
                prefixes.append(d[: rng.randint(1, len(d) - 1)])
    return [p[-cfg.distill_max_prefix :] for p in prefixes]


def length_groups(lengths: list[int], budget: int, max_batch: int) -> list[list[int]]:
    """Indices sorted by length, grouped so that size x longest <= budget tokens.

    Similar lengths keep padding/truncation waste low; the token budget keeps
    long-prompt batches (and their KV caches) small.
    """
    groups: list[list[int]] = [[]]
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        group = groups[-1]
        if group and (len(group) >= max_batch or lengths[i] * (len(group) + 1) > budget):
            groups.append([])
        groups[-1].append(i)
    return groups


@torch.no_grad()
def build_distill_set(
    target: PreTrainedModel, prefixes: list[list[int]], cfg: RunConfig
) -> list[tuple[list[int], list[int]]]:
    """(tokens, labels) pairs labelled with the target's greedy (argmax) choices.

    tokens = prefix + target greedy continuation; labels at every position are
    the target's argmax there, so the draft learns exactly what it must predict
    to be accepted. Each group is left-truncated to its shortest prefix so a
    batch needs no padding or attention mask.
    """
    lengths = [len(p) + cfg.distill_new_tokens for p in prefixes]
    pairs: list[tuple[list[int], list[int]]] = []
    for group in tqdm(length_groups(lengths, cfg.gen_tokens, cfg.gen_batch), desc="distill-gen", mininterval=2.0):
        width = min(len(prefixes[i]) for i in group)
        ids = torch.tensor([prefixes[i][-width:] for i in group])
        gen, prompt_preds = greedy_generate(target, ids, cfg.distill_new_tokens)
        # The prediction after the last generated token is unknown; drop it.
        tokens = torch.cat([ids, gen], dim=1)[:, :-1]
        labels = torch.cat([prompt_preds, gen[:, 1:]], dim=1)
        pairs.extend(zip(tokens.tolist(), labels.tolist(), strict=True))
    return pairs


def distill_batches(
    pairs: list[tuple[list[int], list[int]]], pad_id: int, budget: int, rng: random.Random
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless right-padded batches of similar-length pairs, ~``budget`` tokens each.

    Right padding needs no attention mask: causal attention never lets real
    positions see later pad positions, and pad labels are ignored.
    """
    groups = length_groups([len(t) for t, _ in pairs], budget, max_batch=budget)
    while True:
        rng.shuffle(groups)
        for group in groups:
            width = max(len(pairs[i][0]) for i in group)
            ids = torch.tensor([pairs[i][0] + [pad_id] * (width - len(pairs[i][0])) for i in group])
            labels = torch.tensor([pairs[i][1] + [IGNORE] * (width - len(pairs[i][1])) for i in group])
            yield ids, labels


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def speculative_acceptance(
    target: PreTrainedModel, draft: PreTrainedModel, prompts: list[list[int]], k: int, new_tokens: int
) -> tuple[float, list[list[int]]]:
    """Batch-1 greedy speculative decoding; returns (accepted/drafted, outputs).

    Each step the draft greedily proposes ``k`` tokens; one full (uncached)
    target forward over context+proposal gives the target's greedy prediction
    at each proposal position. The longest matching prefix is accepted and the
    target's own next token is appended, so outputs equal plain target greedy.
    """
    accepted = drafted = 0
    outputs: list[list[int]] = []
    for prompt in tqdm(prompts, desc="spec-eval", mininterval=2.0):
        seq = torch.tensor([prompt])
        while seq.shape[1] - len(prompt) < new_tokens:
            proposal, _ = greedy_generate(draft, seq, k)
            preds = target(input_ids=torch.cat([seq, proposal], dim=1)).logits[0, seq.shape[1] - 1 :].argmax(-1)
            n = 0
            while n < k and proposal[0, n] == preds[n]:
                n += 1
            accepted += n
            drafted += k
            seq = torch.cat([seq, proposal[:, :n], preds[n].view(1, 1)], dim=1)
        outputs.append(seq[0, len(prompt) : len(prompt) + new_tokens].tolist())
    return accepted / drafted, outputs


@torch.no_grad()
def teacher_forced_agreement(target: PreTrainedModel, draft: PreTrainedModel, seqs: list[list[int]]) -> float:
    """Fraction of positions where draft argmax == target argmax on given sequences."""
    same = total = 0
    for s in seqs:
        ids = torch.tensor([s])
        same += int((target(input_ids=ids).logits.argmax(-1) == draft(input_ids=ids).logits.argmax(-1)).sum())
        total += len(s)
    return same / total


@torch.no_grad()
def mean_loss(model: PreTrainedModel, seqs: list[list[int]]) -> float:
    """Token-weighted next-token cross-entropy on real text."""
    total = count = 0.0
    for s in seqs:
        ids = torch.tensor([s])
        logits = model(input_ids=ids).logits[0, :-1]
        total += float(F.cross_entropy(logits, ids[0, 1:], reduction="sum"))
        count += len(s) - 1
    return total / count
