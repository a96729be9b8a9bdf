"""Helpers of the proposer and tree tests: the tiny llama pair with a tiny draft head, ragged
prompts, the batch-1 oracle (`specviz.engine.reference`, no engine code), and one run."""

from __future__ import annotations

import functools

from exactness import PROMPTS, pair_for

from specviz.engine.config import RunConfig
from specviz.engine.proposers import EagleHead
from specviz.engine.reference import greedy_reference
from specviz.engine.run import run

MAX_NEW = 8
# 32 prompts of 1 to 90 characters: batch 32 holds them all, smaller batches split them unevenly.
MANY = PROMPTS + [p[::-1] + "!" for p in PROMPTS]


@functools.cache
def tiny_pair():
    """The tiny llama pair of the exactness tests, with a freshly initialised head for its target."""
    pair = pair_for("llama")
    pair.head = EagleHead.for_target(pair.target, inner=64, seed=1)
    return pair


@functools.cache
def oracle(prompts: tuple[str, ...] = tuple(MANY), max_new: int = MAX_NEW) -> tuple[tuple[int, ...], ...]:
    pair = tiny_pair()
    return tuple(
        tuple(greedy_reference(pair.target, pair.tokenizer(p)["input_ids"], max_new, frozenset([1]), pair.device)[0])
        for p in prompts
    )


def decode(method: str, proposer: str, batch: int, tree: int = 0, prompts: list[str] = MANY, **extra):
    extra.setdefault("max_new_tokens", MAX_NEW)
    config = RunConfig(
        method=method,
        batch_size=batch,
        draft_k=3,
        reference=False,
        proposer=proposer,
        tree_branches=tree,
        **extra,
    )
    return run(tiny_pair(), prompts, config)


def outputs(trace) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(s.output_ids) for s in sorted(trace.sequences, key=lambda s: s.seq_id))


def with_oracle(trace, prompts: list[str] = MANY):
    """The trace with each sequence's reference attached (so `check` judges outputs too)."""
    expected = oracle(tuple(prompts))
    for seq in trace.sequences:
        seq.reference_ids = list(expected[seq.seq_id])
        seq.reference_margins = [1.0] * len(seq.reference_ids)  # not near-ties: a divergence is not "numerical"
    return trace
