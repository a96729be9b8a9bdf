"""What a watched target's cache holds (`specviz/watch/content.py`): the layer-0 keys copied before a
padded call are compared at close with the keys of the tokens each row's sequence committed. Checked
here on a tiny model's own DynamicCache: a right cache reads no mismatch, a slot holding another
token's key (or a key at another position) is named, a static or over-budget copy is refused."""

from __future__ import annotations

import pytest
import torch
from tiny import make_pair
from transformers import DynamicCache

from specviz.trace.schema import RowRecord
from specviz.watch.content import ContentCheck, KeyCopies, attended_cache_slots, check_content


@pytest.fixture(scope="module")
def target():
    return make_pair("llama").target


def _prefilled(model, rows: list[list[int]]) -> DynamicCache:
    """Both rows prefilled, left padded (pad 0 masked), positions from each row's first token."""
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), cache=cache)
    return cache


def _row(seq_id: int, pad: int, width: int) -> RowRecord:
    row = RowRecord(0, seq_id, width - pad + 1, pad, pad, 9, [], [], 0, None, [], seq_id, [], [], 0, 0)
    row.mask_rle = [[0, pad], [1, width - pad], [1, 1]] if pad else [[1, width + 1]]
    return row


ROWS = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]


def test_a_right_cache_reads_no_mismatch_and_a_swapped_slot_is_named(target) -> None:
    cache = _prefilled(target, ROWS)
    keys = KeyCopies()(cache, 6, 2)
    assert keys is not None and keys.shape[:3] == (2, cache.layers[0].keys.shape[1], 6)
    rows = [_row(0, 0, 6), _row(1, 3, 6)]
    checks = [ContentCheck(rows[0], keys[0], ROWS[0]), ContentCheck(rows[1], keys[1], ROWS[1])]
    assert check_content(target, checks) is None
    assert [(r.kv_content_checked, r.kv_mismatch_slot) for r in rows] == [(True, None), (True, None)]
    moved = keys.clone()
    moved[1, :, 4], moved[1, :, 5] = keys[1, :, 5], keys[1, :, 4]  # two slots of row 1 swapped (positions 1, 2)
    rows = [_row(1, 3, 6)]
    check_content(target, [ContentCheck(rows[0], moved[1], ROWS[1])])
    assert rows[0].kv_mismatch_slot == 4  # its second token's slot
    rolled = torch.roll(keys, 1, dims=2)  # every slot one too far (a realignment rolled once more)
    rows = [_row(0, 0, 6)]
    check_content(target, [ContentCheck(rows[0], rolled[0], ROWS[0])])
    assert rows[0].kv_mismatch_slot == 0


def test_rows_not_copied_are_counted_in_a_note_and_left_unchecked(target) -> None:
    cache = _prefilled(target, ROWS)
    keys = KeyCopies()(cache, 6, 2)
    checked, unchecked = _row(0, 0, 6), _row(1, 3, 6)
    note = check_content(target, [ContentCheck(checked, keys[0], ROWS[0]), ContentCheck(unchecked, None, ROWS[1])])
    assert note is not None and note.startswith("KV content checked on 1 of 2 rows")
    assert checked.kv_content_checked and not unchecked.kv_content_checked
    assert check_content(target, [ContentCheck(_row(1, 3, 6), None, ROWS[1])]) is None  # none copied: no note


def test_copies_refuse_other_layouts_and_stop_at_the_budget(target) -> None:
    cache = _prefilled(target, ROWS)
    assert KeyCopies()(cache, 5, 2) is None  # a cache that holds more slots than it counts (static)
    assert KeyCopies()(cache, 6, 3) is None  # another batch
    assert KeyCopies()(None, 6, 2) is None and KeyCopies()((), 6, 2) is None
    one = cache.layers[0].keys.numel() * cache.layers[0].keys.element_size()
    copies = KeyCopies(budget=one)
    assert copies(cache, 6, 2) is not None and copies(cache, 6, 2) is None and copies.left == 0


def test_attended_cache_slots_reads_the_runs_below_the_cache_width() -> None:
    assert attended_cache_slots([[0, 2], [1, 3], [0, 1], [1, 2]], 7) == [2, 3, 4, 6]
    assert attended_cache_slots([[1, 4], [1, 3]], 5) == [0, 1, 2, 3, 4]


def test_a_model_that_refuses_the_key_pass_leaves_a_note_not_a_crash(target) -> None:
    """The check runs the target at close: a model that raises there must not cost the user the trace."""
    cache = _prefilled(target, ROWS)
    keys = KeyCopies()(cache, 6, 2)

    class Refuses(torch.nn.Module):
        config = target.config

        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, **_):
            raise RuntimeError("expected all tensors to be on the same device")

    row = _row(0, 0, 6)
    note = check_content(Refuses(), [ContentCheck(row, keys[0], ROWS[0])])
    assert note == "KV content not checked: expected all tensors to be on the same device"
    assert not row.kv_content_checked
