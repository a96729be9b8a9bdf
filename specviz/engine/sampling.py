"""Keyed sampling noise and logit filters: pure functions, the definition of what a sample is.

Coupled sampling makes a run at temperature > 0 judgeable token for token: the random noise for
the token at logical index `p` of sequence `seq_id` is a function of `(seed, seq_id, p)` alone,
never of the batch row, the step or how many times the engine looked. A sequence then samples the
same tokens in any batch, and the batch-1 reference, sampling from the target with the same keys,
is an oracle again. Gumbel-max makes the noise a plain addition: with `g ~ Gumbel(0, 1)` per
vocabulary entry, `argmax(logits / T + g)` is a sample from `softmax(logits / T)`.

Both the engine (`rules.py`) and the independent oracle (`reference.py`) import this module. That
does not couple them the way shared engine code would: nothing here holds or moves state, it only
states which noise belongs to which key and what top-k / top-p keep, which both sides must agree
on by definition (the spec of a sample), as they agree on the model.

The noise is a counter-based hash, not a stateful generator: a [B, q, V] noise tensor is a few
elementwise integer kernels on the logits' device, and any slice of it equals the same slice
computed alone (a batch-1 reference computes [1, 1, V] and gets identical values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MODES = ("greedy", "coupled", "rejection")

# Independent noise streams: what the draft and the coupled target sample with, the rejection
# rule's acceptance coin, and the rejection rule's residual / bonus sample.
STREAM_SAMPLE = 0
STREAM_ACCEPT = 1
STREAM_RESIDUAL = 2

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
_MARGIN_CAP = 1e9  # a margin with one surviving token is infinite; traces hold finite numbers


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen. `greedy` ignores everything else."""

    mode: str = "greedy"
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    seed: int = 0
    repetition_penalty: float = 1.0  # transformers' semantics (penalty.py); 1: off

    @property
    def greedy(self) -> bool:
        return self.mode == "greedy"


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2**32 for x in [0, 2**32), in int64 without ever overflowing it.

    The constant is split in 16-bit halves so every product stays below 2**49: the result is
    the same on any device and never relies on signed overflow wrapping.
    """
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (lowbias32) on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _absorb(state: torch.Tensor, value: torch.Tensor | int) -> torch.Tensor:
    """Fold one more key component into the hash state."""
    return _mix32(((state + _GOLDEN) & _MASK32) ^ (value & _MASK32))


def keyed_bits(seed: int, stream: int, seq_ids: torch.Tensor, indices: torch.Tensor, vocab: int | None) -> torch.Tensor:
    """32 random bits per (seed, stream, seq_id, index[, vocab entry]).

    `seq_ids` [B], `indices` [B, q] (logical token indices). Returns [B, q, V] with `vocab`,
    else [B, q] (one draw per token, for the acceptance coin).
    """
    device = indices.device
    state = _absorb(_mix32(torch.tensor(seed & _MASK32, device=device)), stream)
    state = _absorb(state, seq_ids.to(device=device, dtype=torch.int64)[:, None])  # [B, 1]
    state = _absorb(state, indices.to(torch.int64))  # [B, q]
    if vocab is None:
        return state
    entries = torch.arange(vocab, device=device, dtype=torch.int64)
    return _absorb(state[..., None], entries)


def keyed_uniform(
    seed: int, stream: int, seq_ids: torch.Tensor, indices: torch.Tensor, vocab: int | None = None
) -> torch.Tensor:
    """Uniforms in (0, 1), float32, exactly representable (23 bits plus a half step)."""
    bits = keyed_bits(seed, stream, seq_ids, indices, vocab) >> 9
    return (bits.to(torch.float32) + 0.5) / float(1 << 23)


def keyed_gumbel(seed: int, stream: int, seq_ids: torch.Tensor, indices: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [B, q, V] for the tokens at `indices` of sequences `seq_ids`."""
    return -torch.log(-torch.log(keyed_uniform(seed, stream, seq_ids, indices, vocab)))


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Top-k then top-p (nucleus) filtering: removed entries become -inf. `logits` already tempered.

    Top-p keeps the smallest prefix of the sorted distribution whose mass reaches `top_p`
    (always at least the most likely token), as Hugging Face's warper does.
    """
    out = logits
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = out.topk(top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = out.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        before = probs.cumsum(-1) - probs  # mass strictly before each entry
        drop_sorted = before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def tempered(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """float32 logits / T, filtered: the distribution a sample is drawn from, in log space."""
    return filter_logits(logits.float() / params.temperature, params.top_k, params.top_p)


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """softmax(tempered logits): what the rejection rule compares."""
    return tempered(logits, params).softmax(-1)


def noisy_scores(
    logits: torch.Tensor, params: SamplingParams, seq_ids: torch.Tensor, indices: torch.Tensor
) -> torch.Tensor:
    """Tempered, filtered logits plus the keyed Gumbel noise: their argmax is the coupled sample."""
    scores = tempered(logits, params)
    return scores + keyed_gumbel(params.seed, STREAM_SAMPLE, seq_ids, indices, logits.shape[-1])


def sample_coupled(
    logits: torch.Tensor, params: SamplingParams, seq_ids: torch.Tensor, indices: torch.Tensor
) -> torch.Tensor:
    """The coupled sample at every slot of `logits` [B, q, V]: [B, q] token ids."""
    return noisy_scores(logits, params, seq_ids, indices).argmax(-1)


def top2_margin(scores: torch.Tensor) -> float:
    """Top-1 minus top-2 of one score vector [V], capped (one surviving token has no runner-up)."""
    top2 = scores.float().topk(2).values
    gap = float(top2[0] - top2[1])
    return _MARGIN_CAP if math.isnan(gap) or gap > _MARGIN_CAP else gap
