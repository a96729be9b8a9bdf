"""What the hooks read off a forward's tensors (`specviz/watch/hooks.py`), on the host through numpy
where that is cheaper: the same values as the torch ops they replace, checked against plain
Python loops over the tensors (the oracle) on random and block-diagonal masks."""

from __future__ import annotations

import random

import torch

from specviz.watch.tensor_reads import argmax_of, attended, line_counts, line_summary, mask_copy


def _oracle(mask: torch.Tensor) -> list[tuple[int, bool, bool, bool]]:
    """Per line: attended count, drops a slot of the line before, continues it (shares a slot and
    gains exactly one), exactly one slot more (a superset); by sets, one line at a time."""
    rows = [{k for k, v in enumerate(line) if v} for line in mask.tolist()]
    out = []
    for i, now in enumerate(rows):
        before = rows[i - 1] if i else None
        if before is None:
            out.append((len(now), False, True, bool(now)))
        else:
            gained = len(now - before) == 1
            out.append((len(now), bool(before - now), bool(before & now) and gained, not before - now and gained))
    return out


def _masks(count: int) -> list[torch.Tensor]:
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    masks = []
    for i in range(count):
        t, keys = rng.randint(1, 24), rng.randint(1, 40)
        if i % 2:
            masks.append(torch.rand(t, keys, generator=gen) < rng.random())
            continue
        mask = torch.zeros(t, keys, dtype=torch.bool)  # packed: causal blocks, some slots let in or out
        start = 0
        while start < t:
            length = rng.randint(1, t - start)
            lo = rng.randint(0, keys - 1)
            for j in range(length):
                mask[start + j, lo : min(keys, lo + j + 1)] = True
            start += length
        mask[rng.randrange(t), rng.randrange(keys)] ^= True
        masks.append(mask)
    return masks


def test_line_summary_equals_the_set_oracle_on_host_and_device_paths() -> None:
    for mask in _masks(300):
        assert line_summary(mask) == _oracle(mask)
        assert line_counts(mask, host=True) == line_counts(mask, host=False)


def test_numpy_reads_equal_torch_ops_and_copy_the_engines_tensors() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 97, generator=gen)
    logits[0, 0, 7] = logits[0, 0, 9] = 50.0  # a tie: the first maximum, as torch
    assert torch.equal(argmax_of(logits), logits.argmax(-1)) and argmax_of(logits)[0, 0] == 7
    half = logits.to(torch.bfloat16)  # a dtype numpy lacks: torch's own op
    assert torch.equal(argmax_of(half), half.argmax(-1))
    additive = torch.where(torch.rand(2, 1, 4, 6, generator=gen) < 0.5, 0.0, torch.finfo(torch.float32).min)
    kind, kept, live = mask_copy(additive)
    assert kind == "4d" and torch.equal(kept, additive[:, 0] == 0) and torch.equal(live, (additive[:, 0] == 0).any(-1))
    ones = (additive[:, 0, -1] == 0).long()
    assert torch.equal(attended(ones), ones != 0)
    additive.fill_(torch.finfo(torch.float32).min)  # the engine reuses its buffer: the copy keeps what was fed
    assert kept.any()


def test_a_tensor_numpy_cannot_read_goes_through_torch() -> None:
    """A negated view (torch's lazy negative bit) has no numpy view: the same read, by torch."""
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(2))
    lazy = torch._neg_view(logits)
    assert lazy.is_neg() and torch.equal(argmax_of(lazy), (-logits).argmax(-1))
