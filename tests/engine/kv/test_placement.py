"""EXSPEC's batch assembly: rows from the pool and new rows prefilled in place give the batch that
stacking single-row prefills gives, and padding is never garbage."""

from __future__ import annotations

import pytest
import torch
from exactness import MAX_NEW, pair_for
from transformers import DynamicCache

from specviz.engine.batch import SeqState
from specviz.engine.kv.moves import stack
from specviz.engine.kv.placement import place_batch
from specviz.engine.kv.pool import KVPool
from specviz.engine.kv.state import cache_layers
from specviz.engine.step import Engine, EngineConfig


def _engine_and_seqs() -> tuple[Engine, list[SeqState]]:
    pair = pair_for("llama")
    texts = ["once upon a time", "a", "the cat sat on the mat", "hi"]  # "a": one token, nothing to cache
    seqs = [SeqState(i, pair.tokenizer(t)["input_ids"]) for i, t in enumerate(texts)]
    return Engine(EngineConfig(pair.target, pair.draft, 4, MAX_NEW, frozenset([1]), 0, pair.device)), seqs


def _assembled(engine: Engine, seqs: list[SeqState], pooled: list[SeqState]):
    pool = KVPool(len(seqs), 64, engine.device, engine.cache_headroom)
    for seq in pooled:
        pool.admit(seq.seq_id, engine.prefill(engine.target, [seq]))
    fresh = {s.seq_id: s.committed - 1 for s in seqs if s not in pooled}
    prefilled: list[int] = []

    def prefill(row: int, cache) -> None:
        prefilled.append(seqs[row].seq_id)
        engine.prefill(engine.target, [seqs[row]], cache)

    state = place_batch(pool, [s.seq_id for s in seqs], fresh, prefill)
    return state, prefilled, pool


def _assert_same_batch(state, expected) -> None:
    assert torch.equal(state.mask, expected.mask) and torch.equal(state.next_pos, expected.next_pos)
    attended = state.mask.bool()[:, None, :, None]
    for got, want in zip(cache_layers(state.cache), cache_layers(expected.cache)):
        assert torch.isfinite(got.keys).all() and torch.isfinite(got.values).all(), "garbage in padding"
        assert torch.allclose(got.keys * attended, want.keys * attended, atol=1e-6)
        assert torch.allclose(got.values * attended, want.values * attended, atol=1e-6)


@pytest.mark.parametrize("pooled_index", [2, 1])  # 1: the pooled row has no slots, the pool no tensors yet
def test_mixed_batch_equals_stacked_single_row_prefills(pooled_index: int) -> None:
    engine, seqs = _engine_and_seqs()
    expected = stack([engine.prefill(engine.target, [s]) for s in seqs], DynamicCache)
    state, prefilled, pool = _assembled(engine, seqs, pooled=[seqs[pooled_index]])
    _assert_same_batch(state, expected)
    with_context = [i for i, s in enumerate(seqs) if i != pooled_index and s.committed > 1]
    assert prefilled == with_context, "new sequences with context are prefilled, once each; the pooled one is not"
    assert set(pool.row_of) == {s.seq_id for s in seqs}, "every sequence holds a pool row"


def test_batch_of_new_sequences_only() -> None:
    engine, seqs = _engine_and_seqs()
    expected = stack([engine.prefill(engine.target, [s]) for s in seqs], DynamicCache)
    state, prefilled, _ = _assembled(engine, seqs, pooled=[])
    _assert_same_batch(state, expected)
    assert prefilled == [0, 2, 3]
