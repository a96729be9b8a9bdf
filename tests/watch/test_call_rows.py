"""Reading one row of one captured call (`specviz.watch.calls`) on hand-built calls: the mask row
the pending token and its drafts were fed, in each mask form the hooks keep (none, 2-D, a 4-D
[cache | query] tail, a static cache's 4-D slots, a packed row's counts), the context before a
slot, the argmax at a slot, the rows' first real slot. Each expected value is read off the mask by
hand (a run-length mask [[value, count], ...] as the recorder writes it)."""

from __future__ import annotations

import dataclasses

import pytest

from specviz.watch.calls import (
    CallReader,
    RowQuery,
    argmax_at,
    attended_ids,
    draft_free_query,
    first_slot_query,
)
from specviz.watch.hooks import CallRecord
from specviz.watch.view import Counted


def read_row(calls: list, index: int, row: int, seq: int | None = None) -> RowQuery:
    """Row `row` of target call `index` as one `CallReader` reads it (as sequence `seq`)."""
    return CallReader(calls)(index, row, seq)


PENDING_AND_TWO = RowQuery(pending=0, drafts=2, chain=())  # the pending token, then two drafts


def call_of(mask_kind: str, mask, cache: int, q: int = 3, batch: int = 1, **fields) -> CallRecord:
    call = CallRecord(
        role="target", rows=None, input_ids=[[7 + r] * q for r in range(batch)],
        positions=[list(range(cache, cache + q))] * batch, positions_fed=True, cache_width=cache,
        mask_kind=mask_kind, mask=mask, batch_size=batch, query_len=q,
    )  # fmt: skip
    for name, value in fields.items():
        setattr(call, name, value)
    call.materialize()
    return call


def causal_tail(cache: int, q: int, attended_cache: list[int]) -> list[list[bool]]:
    """A 4-D [cache | query] mask's q query rows: the given cache slots, then causal."""
    return [[bool(attended_cache[j]) for j in range(cache)] + [j <= i for j in range(q)] for i in range(q)]


def test_no_mask_attends_everything_before() -> None:
    call = call_of("none", None, cache=4)
    assert call.views[0].mask_row(0, 3) == ([[1, 7]], 4, None)
    assert call.views[0].mask_row(1, 2) == ([[1, 7]], 5, None)  # one re-fed token before it
    assert call.views[0].before(2) == 6


def test_a_2d_mask_row_is_its_columns_up_to_the_last_draft() -> None:
    """Cache of 4 with its first slot padding, query of 3: [0, 1, 1, 1 | 1, 1, 1]."""
    call = call_of("2d", [[0, 1, 1, 1, 1, 1, 1]], cache=4)
    assert call.views[0].mask_row(0, 3) == ([[0, 1], [1, 6]], 3, None)
    assert call.views[0].mask_row(1, 1) == ([[0, 1], [1, 5]], 4, None)  # slot 1 pending, nothing after
    assert call.views[0].before(0) == 3 and call.views[0].before(2) == 5
    assert call.views[0].attends_cache()
    right_padded = call_of("2d", [[1, 1, 1, 1, 0]], cache=2)  # its last query slot is padding
    assert attended_ids(right_padded, 0) == [7, 7] and first_slot_query(right_padded, 0) == RowQuery(0, 1, ())
    holed = call_of("2d", [[1, 1, 1, 0, 1]], cache=2)  # a masked slot between the pending token and a draft
    assert first_slot_query(holed, 0) is None and attended_ids(holed, 0) == [7, 7]


def test_a_4d_tail_is_causal_only_when_every_query_row_sees_the_same_context_and_itself() -> None:
    call = call_of("4d", [causal_tail(3, 3, [1, 0, 1])], cache=3)
    assert call.views[0].mask_row(0, 3) == ([[1, 1], [0, 1], [1, 4]], 2, True)
    assert call.views[0].before(1) == 3
    future = causal_tail(3, 3, [1, 1, 1])
    future[0][4] = True  # the pending token sees the first draft
    assert call_of("4d", [future], cache=3).views[0].mask_row(0, 3)[2] is False
    other_context = causal_tail(3, 3, [1, 1, 1])
    other_context[2][0] = False  # the last draft lost a context slot
    assert call_of("4d", [other_context], cache=3).views[0].mask_row(0, 3)[2] is False
    missing_self = causal_tail(3, 3, [1, 1, 1])
    missing_self[1][4] = False  # the first draft does not see itself
    assert call_of("4d", [missing_self], cache=3).views[0].mask_row(0, 3) == ([[1, 4], [0, 1], [1, 1]], 3, False)
    short = call_of("4d", [causal_tail(3, 3, [1, 1, 1])[1:]], cache=3)  # only the last 2 query rows kept
    assert short.views[0].mask_row(0, 3) == ([], -1, None) and short.views[0].before(0) == -1


def test_a_static_cache_mask_is_read_by_counts() -> None:
    """Keys are an 8-slot cache: the pending token attends slots {0, 1, 2, 5}, each draft one more
    slot (its own); a draft that gains two slots (a stale one let in) breaks the diagonal."""

    def rows(*sets: set[int]) -> list[list[bool]]:
        return [[j in s for j in range(8)] for s in sets]

    good = rows({0, 1, 2, 5}, {0, 1, 2, 5, 6}, {0, 1, 2, 5, 6, 7})
    call = call_of("4d-slots", [good], cache=8)
    assert call.views[0].mask_row(0, 3) == ([[1, 6]], 3, True)
    assert call.views[0].before(0) == 3 and call.views[0].before(2) == 5
    stale = rows({0, 1, 2, 5}, {0, 1, 2, 3, 5, 6}, {0, 1, 2, 3, 5, 6, 7})
    assert call_of("4d-slots", [stale], cache=8).views[0].mask_row(0, 3) == ([[1, 4], [0, 1], [1, 1]], 3, False)
    moved = rows({0, 1, 2, 5}, {0, 1, 2, 6}, {0, 1, 2, 6, 7})  # as many slots, but not a superset
    assert call_of("4d-slots", [moved], cache=8).views[0].mask_row(0, 3)[2] is False
    short = call_of("4d-slots", [good[1:]], cache=8)  # the pending slot's mask row was not kept
    assert short.views[0].mask_row(0, 3) == ([], -1, None)


def counted(counts: list[tuple[int, bool]]) -> CallRecord:
    """A packed call's segment as `batchmap.apply` leaves it: its view read by counts."""
    return call_of("unknown", None, cache=0, views=[Counted([1] * len(counts), 3, counts)])


def test_a_packed_rows_counts_are_read_like_a_static_cache() -> None:
    call = counted([(4, False), (5, True), (6, True)])
    assert call.views[0].mask_row(0, 3) == ([[1, 6]], 3, True)
    assert call.views[0].before(2) == 5
    leak = counted([(4, False), (5, True), (7, False)])
    assert leak.views[0].mask_row(0, 3) == ([[1, 5], [0, 1]], 3, False)
    unknown = call_of("unknown", None, cache=2)  # a mask the hooks could not read
    assert unknown.views[0].mask_row(0, 3) == ([], -1, None) and unknown.views[0].before(1) == -1


def test_argmax_at_a_slot_and_the_rows_sequences() -> None:
    """Logits kept for the last two query slots of four (logits_to_keep=2)."""
    call = call_of("none", None, cache=0, q=4, batch=2, argmax=[[30, 31], [40, 41]], rows=(5, 9))
    assert [argmax_at(call, 1, s) for s in range(4)] == [None, None, 40, 41]
    assert call.seq_ids == (5, 9)
    call.argmax_is_choice = False  # the engine samples: no argmax is its choice
    assert argmax_at(call, 1, 3) is None
    assert call_of("none", None, cache=0, batch=2, rows=(5,)).seq_ids == (0, 1)  # another size: default order
    assert not call.views[0].attends_cache()  # no cache
    unattended = call_of("2d", [[0, 0, 1, 1, 1]], cache=2)
    assert not unattended.views[0].attends_cache() and call_of("4d", None, cache=2).views[0].attends_cache()


def test_a_reading_is_frozen() -> None:
    """`CallReader` hands the same reading to every caller (cached per call, row and sequence)."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        PENDING_AND_TWO.pending = 1


def test_drafts_without_a_draft_model_are_read_from_the_layout() -> None:
    """No draft model: the pending token is the row's first real slot when it attends a cache,
    else the slot after its re-fed committed tokens; the drafts follow it. Read from the layout,
    so a slot let into the last draft's view (a KV leak, flagged by the KV check) does not move
    the reading; the count is only the fallback."""
    committed = [5, 6, 9]  # 9: the pending token
    cached = call_of("none", None, cache=4, input_ids=[[9, 11, 12]])
    assert draft_free_query(cached, 0, committed) == RowQuery(0, 2, ())
    refed = [(1, False), (2, True), (3, True), (4, True), (6, False)]  # the last draft attends 6, not 5
    leaky = call_of("unknown", None, cache=0, q=5, input_ids=[[5, 6, 9, 11, 12]], views=[Counted([1] * 5, 0, refed)])
    assert draft_free_query(leaky, 0, committed) == RowQuery(2, 2, ())
    assert draft_free_query(cached, 0, [5, 6, 8]) is None  # its first slot is not the pending token
    assert draft_free_query(cached, 0, []) is None
    alone = call_of("none", None, cache=4, q=1, input_ids=[[9]])  # the pending token, no drafts
    assert draft_free_query(alone, 0, committed) is None


def test_a_declared_draft_batch_is_read_by_its_declared_rows() -> None:
    """Two sequences pending the same token 9 and both drafted 11; the draft call declared its
    rows reversed (row 1 holds sequence 0, at position 3). Sequence 0's draft is its declared
    row's, whose fed position (3) is the verify's, not the same index's (5)."""
    draft = call_of("none", None, cache=3, q=1, batch=2, role="draft", rows=(1, 0), input_ids=[[9], [9]],
                    positions=[[5], [3]], argmax=[[11], [11]])  # fmt: skip
    verify = call_of("none", None, cache=3, q=2, batch=2, rows=(0, 1), input_ids=[[9, 11], [9, 11]],
                     positions=[[3, 4], [5, 6]])  # fmt: skip
    assert read_row([draft, verify], 1, 0) == RowQuery(0, 1, ((0, 1),))
    assert read_row([draft, verify], 1, 1) == RowQuery(0, 1, ((0, 0),))
