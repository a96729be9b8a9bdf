"""What the hooks read off a forward's tensors (`specviz/watch/tensor_reads.py`), on small masks
and logits whose every answer is worked out by hand: a mask's kind and "may attend" booleans
(bool, 0/1 and additive float masks, 2-D and 4-D), the per-token summary of a packed row's mask,
the key slots of each packed sequence, and the argmax, the same through numpy and through torch."""

from __future__ import annotations

import numpy
import pytest
import torch

# The code under test, in one block.
from specviz.watch.tensor_reads import (
    QUERY_TAIL,
    any_last,
    argmax_of,
    attended,
    line_counts,
    line_summary,
    mask_copy,
    on_host,
    segment_slots,
    shared_slots,
)

NEG = torch.finfo(torch.float32).min


def rows(*lines: str) -> torch.Tensor:
    """A boolean [T, keys] mask from strings of 0/1, one per query token."""
    return torch.tensor([[c == "1" for c in line] for line in lines])


# ----------------------------------------------------------------------------- line_summary


def test_two_packed_causal_sequences_line_by_line() -> None:
    """Keys 0-2 hold sequence A (3 tokens), keys 3-4 sequence B (2 tokens), block-diagonal causal:
    A's tokens attend 1, 2, 3 slots, each continuing the one before (shares, gains its own key); B's
    first attends 1 slot, dropping A's three (shares none: it does not continue, and attends fewer,
    not one more); B's second continues it."""
    mask = rows("10000", "11000", "11100", "00010", "00011")
    assert line_summary(mask) == [
        (1, False, True, True),
        (2, False, True, True),
        (3, False, True, True),
        (1, True, False, False),
        (2, False, True, True),
    ]


def test_a_sliding_window_continues_but_does_not_attend_one_more() -> None:
    """A window of 2: the third token drops key 0 and gains key 2 (shares key 1): it continues the
    token before, but attends the same number of slots, not one more."""
    lines = line_summary(rows("100", "110", "011"))
    assert lines == [(1, False, True, True), (2, False, True, True), (2, True, True, False)]


def test_a_neighbours_first_token_gains_its_whole_context() -> None:
    """A token that shares a slot but gains two does not continue (a leaked shared slot), and one
    that gains two without dropping attends more than one more."""
    assert line_summary(rows("1000", "1110")) == [(1, False, True, True), (3, False, False, False)]
    assert line_summary(rows("0000", "1000")) == [(0, False, True, False), (1, False, False, True)]


def test_line_summary_of_a_float_mask_and_of_no_tokens() -> None:
    mask = torch.tensor([[1, 0], [1, 1]], dtype=torch.int64)  # 0/1: read as bool
    assert line_summary(mask) == [(1, False, True, True), (2, False, True, True)]
    assert line_summary(torch.zeros(0, 3, dtype=torch.bool)) == []


def test_line_counts_on_the_host_and_through_torch_agree() -> None:
    mask = rows("110", "011", "111", "000")
    expected = ([2, 2, 3, 0], [1, 2, 0])  # counts; slots shared with the line before
    assert line_counts(mask) == expected
    assert line_counts(mask, host=True) == expected
    assert line_counts(mask, host=False) == expected


# ----------------------------------------------------------------------------- packed slots


def test_segment_slots_are_each_sequences_first_and_last_token() -> None:
    mask = rows("10000", "11000", "11100", "00010", "00011")
    (a_first, a_last), (b_first, b_last) = segment_slots(mask, [(0, 0, 3), (0, 3, 2)])
    assert a_first.tolist() == [True, False, False, False, False]
    assert a_last.tolist() == [True, True, True, False, False]
    assert b_first.tolist() == [False, False, False, True, False]
    assert b_last.tolist() == [False, False, False, True, True]
    ((only, same),) = segment_slots(mask, [(0, 3, 1)])  # one token: first and last alike
    assert only.tolist() == same.tolist() == [False, False, False, True, False]


def test_shared_slots_over_the_shorter_row() -> None:
    a = numpy.array([True, True, False, True])
    b = numpy.array([True, False, True])  # a call with fewer keys: slot 3 not compared
    assert shared_slots(a, b) == 1 and shared_slots(b, a) == 1
    assert shared_slots(a, a) == 3
    assert shared_slots(a, numpy.array([], dtype=bool)) == 0


# ----------------------------------------------------------------------------- mask_copy


def test_mask_kinds() -> None:
    assert mask_copy(None) == ("none", None, None)
    assert mask_copy([[1, 1]]) == ("unknown", None, None)  # not a tensor
    assert mask_copy(torch.ones(2, 1, 3)) == ("unknown", None, None)  # 3-D
    assert mask_copy(torch.ones(1, 1, 1, 1, 1)) == ("unknown", None, None)


def test_a_2d_mask_is_copied_as_booleans() -> None:
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    kind, seen, live = mask_copy(mask)
    assert kind == "2d" and live is None and seen.tolist() == [[False, True, True], [True, True, True]]
    engine = torch.tensor([[False, True]])
    kind, seen, _ = mask_copy(engine)
    engine[0, 0] = True  # the engine reuses its mask: ours must not change
    assert kind == "2d" and seen.tolist() == [[False, True]]


def test_a_4d_mask_keeps_head_0s_last_query_rows_and_which_query_slots_attend() -> None:
    """[B=1, heads=2, q=3, keys=3] additive: query 0 is padding (attends nothing), 1 and 2 causal."""
    head = torch.tensor([[NEG, NEG, NEG], [0.0, 0.0, NEG], [0.0, 0.0, 0.0]])
    mask = torch.stack([head, torch.zeros(3, 3)])[None]  # head 1 differs: never read
    kind, seen, live = mask_copy(mask, tail=2)
    assert kind == "4d"
    assert seen.tolist() == [[[True, True, False], [True, True, True]]]
    assert live.tolist() == [[False, True, True]]
    kind, whole, live = mask_copy(mask, tail=None)  # a packed row: all of it, the rest read at close
    assert kind == "4d" and live is None
    assert whole.tolist() == [[[False, False, False], [True, True, False], [True, True, True]]]
    assert mask_copy(mask)[1].shape == (1, 3, 3)  # the default tail is longer than 3 rows
    assert QUERY_TAIL >= 3


def test_a_4d_bool_mask_kept_whole_is_a_copy() -> None:
    engine = torch.tensor([[[[True, False], [True, True]]]])
    _, whole, _ = mask_copy(engine, tail=None)
    engine[0, 0, 0, 1] = True
    assert whole.tolist() == [[[True, False], [True, True]]]
    _, tail, _ = mask_copy(engine, tail=1)
    engine[0, 0, 1, 0] = False
    assert tail.tolist() == [[[True, True]]]


# ----------------------------------------------------------------------------- attended


@pytest.mark.parametrize("size", [3, 5000])  # below and above the size numpy is used from
def test_attended_reads_bool_0_1_and_additive_masks(size: int) -> None:
    want = torch.arange(size) % 3 != 0  # key 0, 3, 6, ... blocked
    assert attended(want) is want  # bool: as is
    assert torch.equal(attended(want.to(torch.int64)), want)  # 0/1: nonzero attends
    assert torch.equal(attended(want.to(torch.uint8)), want)
    additive = torch.where(want, 0.0, NEG)  # 0 attends, a large negative number blocks
    assert torch.equal(attended(additive), want)
    assert torch.equal(attended(additive.to(torch.float16)), want)
    assert torch.equal(attended(torch.where(want, 0.0, float("-inf")).to(torch.bfloat16)), want)  # torch's op
    assert attended(additive).dtype == torch.bool


# ----------------------------------------------------------------------------- argmax and any


def test_argmax_is_the_first_maximum() -> None:
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 5.0, 5.0], [-2.0, -1.0, -3.0, -1.5]])
    assert argmax_of(logits).tolist() == [1, 0, 1]
    assert argmax_of(logits.to(torch.bfloat16)).tolist() == [1, 0, 1]  # torch's own op
    assert argmax_of(logits[None]).tolist() == [[1, 0, 1]]


def test_any_last() -> None:
    seen = rows("000", "010", "111")
    assert any_last(seen).tolist() == [False, True, True]
    assert any_last(seen.to(torch.float32)).tolist() == [False, True, True]


def test_on_host_reads_cpu_tensors_numpy_has() -> None:
    t = torch.arange(6, dtype=torch.float32)
    view = on_host(t)
    assert isinstance(view, numpy.ndarray) and view.tolist() == [0, 1, 2, 3, 4, 5]
    t[0] = 9.0
    assert view[0] == 9.0  # a view, no copy
    assert on_host(t, least=6) is not None
    assert on_host(t, least=7) is None  # fewer elements than asked for
    assert on_host(t.to(torch.bfloat16)) is None  # numpy has no bfloat16
    assert on_host(torch._neg_view(t)) is None  # a lazy negated view numpy cannot read
    assert on_host(torch.ones(2, requires_grad=True)) is not None  # detached first
