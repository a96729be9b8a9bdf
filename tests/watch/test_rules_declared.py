"""What an engine declares to the watch, checked where it comes in (`specviz/watch/declared.py`):
trees, drafts and chunks, the temperature, ids, prompts, the models' end-of-sequence and padding
ids, and the two errors a finished run can end in. Each case says what a correct engine's
declaration reads as and what a malformed one is told, with the values worked out by hand."""

from __future__ import annotations

from types import SimpleNamespace

import numpy
import pytest
import torch

# The code under test, in one block.
from specviz.watch.attribution import Emit
from specviz.watch.declared import (
    as_int,
    checked_segments,
    checked_temperature,
    checked_trees,
    eos_ids,
    pad_id,
    prompt_ids,
    require_emits,
    require_prompted,
)
from specviz.watch.hooks import WatchError
from specviz.watch.record import CallRecord


def call(role: str) -> CallRecord:
    return CallRecord(
        role=role, rows=None, input_ids=[[1]], positions=[[0]], positions_fed=True, cache_width=0,
        mask_kind="none", mask=None, batch_size=1, query_len=1,
    )  # fmt: skip


def emit(seq_id: int, tokens: list[int]) -> Emit:
    return Emit(seq_id=seq_id, tokens=tokens, finish_reason=None, after=1, at=0.0)


# ----------------------------------------------------------------------------- trees


def test_trees_are_one_per_row_of_the_target() -> None:
    assert checked_trees([[-1, 0, 0], None], 2, "target") == [[-1, 0, 0], None]
    assert checked_trees(torch.tensor([[-1, 0], [-1, 0]]), 2, "target") == [[-1, 0], [-1, 0]]
    assert checked_trees(((-1, 0, 1),), 1, "target") == [[-1, 0, 1]]  # tuples become lists
    with pytest.raises(WatchError, match="declares the target's trees"):
        checked_trees([[-1]], 1, "draft")
    with pytest.raises(WatchError, match="one list of parent indices per row"):
        checked_trees([-1, 0], 2, "target")  # one flat tree, not one per row
    with pytest.raises(WatchError, match="2 sequences need 2 trees in parents=, got 1"):
        checked_trees([[-1, 0]], 2, "target")
    with pytest.raises(WatchError, match="2 sequences need 2 trees in parents=, got 3"):
        checked_trees([[-1], [-1], [-1]], 2, "target")


def test_a_malformed_tree_names_its_row() -> None:
    with pytest.raises(WatchError, match=r"the tree of row 1 \[-1, 2\]: each node's parent must be an earlier"):
        checked_trees([[-1, 0], [-1, 2]], 2, "target")
    with pytest.raises(WatchError, match=r"the tree of row 0 \[0\]: node 0"):
        checked_trees([[0], None], 2, "target")


# ----------------------------------------------------------------------------- drafts and chunks


def test_drafts_and_chunks_per_sequence() -> None:
    assert checked_segments(None, None, None, 2) == ((None, False), (None, False))
    assert checked_segments([2, None], [False, False], [3, 1], 2) == ((2, False), (None, False))
    assert checked_segments([0, 0], [True, False], [5, 1], 2) == ((0, True), (0, False))
    assert checked_segments([numpy.int64(1)], None, None, 1) == ((1, False),)
    assert checked_segments(None, [True], None, 1) == ((None, True),)


def test_drafts_and_chunks_of_the_wrong_size_or_kind() -> None:
    for drafts, chunk in (([1], None), (None, [False]), ([1, 1, 1], None), (None, [False] * 3)):
        with pytest.raises(WatchError, match="2 sequences need 2 entries in drafts= and chunk="):
            checked_segments(drafts, chunk, None, 2)
    with pytest.raises(WatchError, match="chunk= is one bool per sequence, got 1 at 1"):
        checked_segments(None, [False, 1], None, 2)
    with pytest.raises(WatchError, match="expected integer ids"):
        checked_segments([True], None, None, 1)


def test_drafts_a_sequence_cannot_carry() -> None:
    """Drafts are >= 0, none in a chunk, and fewer than the sequence's query tokens (one of which is
    the pending token): 2 drafts fit a query of 3, not of 2."""
    assert checked_segments([2], None, [3], 1) == ((2, False),)
    for drafts, chunk, lens in (([-1], None, None), ([1], [True], None), ([2], None, [2]), ([3], None, [2])):
        with pytest.raises(WatchError, match="sequence 0 cannot carry"):
            checked_segments(drafts, chunk, lens, 1)
    with pytest.raises(WatchError, match="sequence 1 cannot carry 4 drafts"):
        checked_segments([0, 4], None, [1, 4], 2)


# ----------------------------------------------------------------------------- values


def test_temperature_is_a_finite_number_at_least_0() -> None:
    assert checked_temperature(0) == 0.0 and isinstance(checked_temperature(0), float)
    assert checked_temperature(0.7) == 0.7
    assert checked_temperature(2) == 2.0
    for bad in (-0.1, float("inf"), float("nan"), True, "1.0", None):
        with pytest.raises(WatchError, match="temperature must be a finite number >= 0"):
            checked_temperature(bad)


def test_ids_are_ints_numpy_ints_or_one_element_tensors() -> None:
    assert as_int(3, "x") == 3
    assert as_int(numpy.int32(4), "x") == 4 and type(as_int(numpy.int32(4), "x")) is int
    assert as_int(torch.tensor(5), "x") == 5 and type(as_int(torch.tensor([5]), "x")) is int
    for bad, kind in ((True, "bool"), (1.0, "float"), (torch.tensor([1, 2]), "Tensor"), (torch.tensor(True), "bool")):
        with pytest.raises(WatchError, match=f"what: expected integer ids, got {kind}"):
            as_int(bad, "what")


def test_prompts_as_ids_or_text() -> None:
    tokenizer = lambda text: {"input_ids": [len(w) for w in text.split()]}  # noqa: E731
    assert prompt_ids(None, None) is None
    assert prompt_ids([[1, 2], (3,)], None) == [[1, 2], [3]]
    assert prompt_ids(iter([torch.tensor([4, 5])]), None) == [[4, 5]]
    assert prompt_ids(["ab cde", "f"], tokenizer) == [[2, 3], [1]]
    # Rows of an array or a tensor are prompts too; an iterator that yields none is an empty list.
    assert prompt_ids(numpy.array([[5, 6], [7, 8]]), None) == [[5, 6], [7, 8]]
    assert prompt_ids(torch.tensor([[5, 6, 7]]), None) == [[5, 6, 7]]
    with pytest.raises(WatchError, match="prompts: empty list"):
        prompt_ids([], None)
    with pytest.raises(WatchError, match="prompts: empty list"):
        prompt_ids(iter([]), None)
    with pytest.raises(WatchError, match="pass tokenizer="):
        prompt_ids(["ab"], None)
    with pytest.raises(WatchError, match=r"prompts\[1\] is empty"):
        prompt_ids([[1], []], None)
    with pytest.raises(WatchError, match=r"prompts\[1\] is empty"):
        prompt_ids(["a", ""], tokenizer)
    with pytest.raises(WatchError, match=r"prompts\[0\]: expected integer ids, got float"):
        prompt_ids([[1.0]], None)


# ----------------------------------------------------------------------------- the models' ids


def test_eos_ids_from_the_generation_config_first_then_the_config_and_the_tokenizer() -> None:
    gen, cfg = SimpleNamespace(eos_token_id=2), SimpleNamespace(eos_token_id=[7, 8])
    model = SimpleNamespace(generation_config=gen, config=cfg)
    assert eos_ids(model, None) == [2]  # the generation config says: the config is not read
    assert eos_ids(model, SimpleNamespace(eos_token_id=9)) == [2, 9]
    assert eos_ids(SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None), config=cfg), None) == [7, 8]
    assert eos_ids(SimpleNamespace(config=SimpleNamespace(eos_token_id=(3, 1))), None) == [1, 3]
    assert eos_ids(SimpleNamespace(), None) == []
    assert eos_ids(SimpleNamespace(), SimpleNamespace(eos_token_id=0)) == [0]
    assert eos_ids(SimpleNamespace(), SimpleNamespace(eos_token_id=None)) == []


def test_pad_id_from_the_tokenizer_then_the_generation_config_then_the_config() -> None:
    model = SimpleNamespace(generation_config=SimpleNamespace(pad_token_id=4), config=SimpleNamespace(pad_token_id=5))
    assert pad_id(model, SimpleNamespace(pad_token_id=0)) == 0  # 0 is an id
    assert pad_id(model, None) == 4
    assert pad_id(model, SimpleNamespace(pad_token_id=None)) == 4
    assert pad_id(SimpleNamespace(config=SimpleNamespace(pad_token_id=5)), None) == 5
    assert pad_id(SimpleNamespace(), None) is None


# ----------------------------------------------------------------------------- a finished run


def test_a_run_that_decoded_must_have_declared_tokens() -> None:
    require_emits([call("target")], [])  # one target call: a prefill, nothing decoded yet
    require_emits([call("target"), call("draft")], [])
    require_emits([call("target"), call("target")], [emit(0, [1])])
    with pytest.raises(WatchError, match="the target ran but no tokens were declared"):
        require_emits([call("target"), call("draft"), call("target")], [])


def test_an_emit_beyond_the_prompts_read_from_the_first_call() -> None:
    require_prompted([[1], [2]], [emit(0, [5]), emit(1, [6])])
    require_prompted([[1]], [])
    with pytest.raises(WatchError, match=r"emit named sequence 2, but the first target call holds 2 prompt\(s\)"):
        require_prompted([[1], [2]], [emit(3, [5]), emit(2, [6]), emit(0, [7])])
