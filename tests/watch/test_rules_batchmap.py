"""`batchmap.apply` on a call that packs trees (`specviz/watch/batchmap.py`): each sequence's row
keeps the key slots its own query tokens attend (a `Slotted` view), so its tree (siblings that do not
see each other) and a slot of a neighbour's that one of its tokens attends can still be read. Every
expected row is written out by hand from the packed mask."""

from __future__ import annotations

import torch

# The code under test, in one block.
from specviz.watch.batchmap import BatchMap, Segment, apply
from specviz.watch.record import CallRecord
from specviz.watch.view import Slotted


def packed_call(ids: list[int], positions: list[int]) -> CallRecord:
    """A materialized packed 1 x T target call: no cache, no mask kept, no argmax."""
    return CallRecord(
        role="target", rows=None, input_ids=[ids], positions=[positions], positions_fed=True, cache_width=0,
        mask_kind="none", mask=None, batch_size=1, query_len=len(ids), packed=True,
    )  # fmt: skip


def seen_of(*lines: str) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in line] for line in lines])


def test_each_sequence_keeps_the_slots_its_own_tokens_attend() -> None:
    """Sequence 7: a pending token and two sibling drafts (keys 0-2: each draft sees the pending
    token and itself, not its sibling). Sequence 9: a chain of two (keys 3-4). Row 0 keeps keys
    0, 1, 2; row 1 keeps keys 3, 4, then one padding row (width 3) that attends nothing."""
    call = packed_call([5, 6, 8, 11, 12], [4, 5, 5, 2, 3])
    seen = seen_of("10000", "11000", "10100", "00010", "00011")
    bmap = BatchMap((Segment(7, 0, 0, 3), Segment(9, 0, 3, 2)), "declared")
    assert apply(call, bmap, seen)
    assert all(isinstance(v, Slotted) for v in call.views)
    assert [v.lines for v in call.views] == [
        [[True, False, False], [True, True, False], [True, False, True]],
        [[True, False], [True, True], [False, False]],
    ]
    assert call.rows == (7, 9) and call.input_ids == [[5, 6, 8], [11, 12, 0]]
    assert call.batch_size == 2 and call.query_len == 3


def test_a_slot_of_a_neighbour_attended_is_kept_in_the_row() -> None:
    """Sequence 9's last token also attends key 1 (sequence 7's: a leak). Its row keeps keys 1, 3
    and 4, in order, so the leaked slot shows as one its first token does not see."""
    call = packed_call([5, 6, 8, 11, 12], [4, 5, 5, 2, 3])
    seen = seen_of("10000", "11000", "10100", "00010", "01011")
    apply(call, BatchMap((Segment(7, 0, 0, 3), Segment(9, 0, 3, 2)), "declared"), seen)
    assert call.views[1].lines == [[False, True, False], [True, True, True], [False, False, False]]
