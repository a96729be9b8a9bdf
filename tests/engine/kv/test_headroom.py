"""Cache layers with room: forwards write in place, moves land in buffers with room, and the
values seen by attention are exactly what concatenation would have given."""

from __future__ import annotations

import pytest
import torch
from exactness import assert_exact, decode, oracle
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from specviz.engine.kv.headroom import MIN_HEADROOM, HeadroomLayer, with_headroom
from specviz.engine.kv.moves import compact
from specviz.engine.kv.state import KVState


def _kv(batch: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, width, 4, generator=generator), torch.randn(batch, 2, width, 4, generator=generator)


def _plain_and_roomy(batch: int, width: int) -> tuple[DynamicCache, DynamicCache]:
    plain, other = DynamicCache(), DynamicCache()
    keys, values = _kv(batch, width, 0)
    plain.update(keys, values, 0)
    other.update(keys.clone(), values.clone(), 0)
    return plain, with_headroom(other, 3)


def test_updates_write_in_place_and_match_concatenation() -> None:
    plain, cache = _plain_and_roomy(2, 5)
    layer = cache.layers[0]
    assert isinstance(layer, HeadroomLayer)
    buffer = layer.key_buffer.data_ptr()
    for step in range(MIN_HEADROOM // 3):
        keys, values = _kv(2, 3, step + 1)
        expected = plain.update(keys, values, 0)
        got = cache.update(keys, values, 0)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert layer.key_buffer.data_ptr() == buffer, "an update within the room reallocated"
    cache.update(*_kv(2, 3 * MIN_HEADROOM, 99), 0)  # past the room: regrows, still exact
    assert torch.equal(cache.layers[0].keys, plain.update(*_kv(2, 3 * MIN_HEADROOM, 99), 0)[0])


def test_keys_assigned_from_outside_are_adopted() -> None:
    """A fault or the reference loop may set `layer.keys` itself: the next update builds on those."""
    _, cache = _plain_and_roomy(2, 5)
    layer = cache.layers[0]
    replaced_keys, replaced_values = _kv(2, 4, 7)
    layer.keys, layer.values = replaced_keys, replaced_values
    assert not layer.owns_view()
    new_keys, new_values = _kv(2, 1, 8)
    keys, values = cache.update(new_keys, new_values, 0)
    assert torch.equal(keys, torch.cat([replaced_keys, new_keys], dim=2))
    assert torch.equal(values, torch.cat([replaced_values, new_values], dim=2))
    assert layer.owns_view()


def test_in_place_writes_from_outside_are_kept() -> None:
    """A fault that overwrites slots in place writes into the buffer the next forward reads."""
    _, cache = _plain_and_roomy(2, 5)
    layer = cache.layers[0]
    layer.keys[0, :, 1] = 42.0
    keys, _ = cache.update(*_kv(2, 1, 3), 0)
    assert bool((keys[0, :, 1] == 42.0).all())


def test_compact_into_room_equals_compact_of_plain_layers() -> None:
    plain, cache = _plain_and_roomy(3, 6)
    mask = torch.ones(3, 6, dtype=torch.long)
    retain = torch.tensor([[1, 1, 1, 0, 1, 0], [0, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 1]], dtype=torch.bool)
    rows = torch.tensor([2, 0])
    next_pos = torch.tensor([3, 4])
    moved_plain = compact(KVState(plain, mask, next_pos), rows, retain, retain, next_pos)
    moved = compact(KVState(cache, mask.clone(), next_pos), rows, retain, retain, next_pos)
    layer = moved.cache.layers[0]
    assert isinstance(layer, HeadroomLayer) and layer.owns_view()
    assert layer.key_buffer.shape[2] >= layer.keys.shape[2] + MIN_HEADROOM, "the move left room for the next forwards"
    real = moved.mask.bool()[:, None, :, None]  # padding slots hold scratch in either
    for name in ("keys", "values"):
        a, b = getattr(moved_plain.cache.layers[0], name), getattr(layer, name)
        assert a.shape == b.shape and torch.equal(a * real, b * real)
    assert torch.equal(moved.mask, moved_plain.mask)


def test_sliding_and_special_layers_are_left_alone() -> None:
    class Special(DynamicLayer):
        pass

    cache = DynamicCache()
    cache.update(*_kv(1, 2, 0), 0)
    cache.layers[0] = Special()
    cache.layers[0].lazy_initialization(*_kv(1, 2, 0))
    assert type(with_headroom(cache, 3).layers[0]) is Special


@pytest.mark.parametrize("method", ["eqspec", "exspec"])
def test_no_forward_of_a_decode_copies_a_cache(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """Every step's forwards fit in the room the last move left: no layer regrows mid-decode, and
    the output is still exactly batch-1 greedy's."""
    regrown: list[tuple[int, int]] = []
    original = HeadroomLayer._regrow

    def spy(self, key_like, value_like, width, needed):
        if needed > width:  # a forward that did not fit (the prefill's conversion has needed == width)
            regrown.append((width, needed))
        return original(self, key_like, value_like, width, needed)

    monkeypatch.setattr(HeadroomLayer, "_regrow", spy)
    trace = decode("llama", method, 6, 4)
    assert_exact(trace, oracle("llama"))
    assert regrown == [], f"{len(regrown)} forwards copied a cache to grow it"
