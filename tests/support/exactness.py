"""Helpers of the exactness tests: prompts of mixed lengths, one cached pair per family, the
batch-1 oracle, and the exactness assertion. Shared by the engine tests of every method."""

from __future__ import annotations

import functools

from tiny import make_pair

from specviz.engine.config import RunConfig
from specviz.engine.reference import greedy_reference
from specviz.engine.run import run

PROMPTS = [
    "a",
    "hi",
    "The cat",
    "once upon a time there was",
    "xyz" * 30,
    "Q: 2+2? A:",
    "z",
    "speculative decoding in batches is hard",
    "ragged",
    "0123456789" * 4,
    "ok",
    "left pad me",
    "the end is near, the end is near",
    "m" * 50,
    "tokens",
    "mixed lengths",
]
MAX_NEW = 20


@functools.cache
def pair_for(family: str, eos: int = 1, pad: int = 0):
    return make_pair(family, eos=eos, pad=pad)


@functools.cache
def oracle(family: str, eos: int = 1, pad: int = 0, max_new: int = MAX_NEW) -> tuple:
    pair = pair_for(family, eos, pad)
    outs = []
    for text in PROMPTS:
        ids = pair.tokenizer(text)["input_ids"]
        outs.append(greedy_reference(pair.target, ids, max_new, frozenset([eos]), pair.device)[0])
    return tuple(tuple(o) for o in outs)


def decode(family: str, method: str, batch: int, k: int, eos: int = 1, pad: int = 0, **extra):
    pair = pair_for(family, eos, pad)
    cfg = RunConfig(method=method, batch_size=batch, draft_k=k, max_new_tokens=MAX_NEW, reference=False, **extra)
    return run(pair, PROMPTS, cfg)


def assert_exact(trace, expected) -> None:
    for seq in trace.sequences:
        assert tuple(seq.output_ids) == expected[seq.seq_id], f"sequence {seq.seq_id} diverged"


def frequent_token(family: str) -> int:
    """A token the target emits often a few steps in: used as EOS so rows end early."""
    counts: dict[int, int] = {}
    for out in oracle(family):
        for token in out[2:10]:
            counts[token] = counts.get(token, 0) + 1
    return max(counts, key=counts.get)
