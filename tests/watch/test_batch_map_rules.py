"""The batch map's rules one at a time (`specviz/watch/batchmap.py`), on hand-built calls as the
hooks leave them: which producer cuts a packed call and where, what a declaration of the wrong size
means, what the map says per token (its role) and per sequence (its own keys), and the rows `apply`
writes. Every expected value is written out by hand from the call's fields; `test_batch_map.py`
has the cases on real models, `test_zoo_production.py` the engines."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specviz.watch.batchmap import BatchMap, Segment, apply, read_map
from specviz.watch.hooks import CallRecord
from specviz.watch.tensor_reads import line_summary
from specviz.watch.view import Counted, View


def call_of(ids: list[list[int]], positions: list[list[int]], **fields) -> CallRecord:
    """A materialized call, B x q, no mask, no cache (fields override)."""
    call = CallRecord(
        role="target", rows=None, input_ids=ids, positions=positions, positions_fed=True, cache_width=0,
        mask_kind="none", mask=None, batch_size=len(ids), query_len=len(ids[0]), packed=len(ids) == 1,
    )  # fmt: skip
    for name, value in fields.items():
        setattr(call, name, value)
    return call


def cut(call: CallRecord) -> list[tuple[int | None, int, int, int]]:
    return [(s.seq, s.row, s.start, s.length) for s in read_map(call).segments]


def test_segment_roles_are_context_then_pending_then_drafts() -> None:
    """A declared segment of 6 tokens with 2 drafts: 3 re-fed, the pending token, 2 drafts; with
    none declared the roles are not said (read from the draft calls instead)."""
    assert Segment(0, 0, 0, 6, drafts=2).roles() == ["context"] * 3 + ["pending", "draft", "draft"]
    assert Segment(0, 0, 0, 1, drafts=0).roles() == ["pending"]
    assert Segment(0, 0, 0, 4).roles() == []


def test_a_map_is_packed_when_a_row_holds_more_than_its_first_columns() -> None:
    padded = BatchMap((Segment(0, 0, 0, 3), Segment(1, 1, 0, 3)), "padded")
    assert not padded.packed
    with pytest.raises(dataclasses.FrozenInstanceError):  # one map per forward, never edited
        padded.source = "declared"
    with pytest.raises(dataclasses.FrozenInstanceError):
        padded.segments[0].seq = 2
    assert BatchMap((Segment(0, 0, 0, 2), Segment(1, 0, 2, 3)), "cu_seq_lens").packed  # two in one row
    assert BatchMap((Segment(0, 0, 1, 2),), "declared").packed  # one sequence, not from column 0


def test_a_padded_batch_is_one_sequence_per_row_in_the_declared_order() -> None:
    ids, pos = [[5, 6], [7, 8], [9, 10]], [[0, 1], [3, 4], [1, 2]]
    assert cut(call_of(ids, pos, rows=(4, 2, 7))) == [(4, 0, 0, 2), (2, 1, 0, 2), (7, 2, 0, 2)]
    # A declaration of another size (a batch that changed since) is the default order, not an error.
    assert cut(call_of(ids, pos, rows=(4, 2))) == [(None, r, 0, 2) for r in range(3)]
    assert cut(call_of(ids, pos, rows=(4, 2, 7, 8))) == [(None, r, 0, 2) for r in range(3)]
    assert read_map(call_of(ids, pos)).source == "padded"


def test_varlen_offsets_cut_the_row_and_give_each_sequence_its_keys() -> None:
    """cu_seq_lens_q [0, 2, 2, 5]: an empty sequence in the middle is no segment; cu_seq_lens_k
    gives each its own span of the shared KV."""
    ids, pos = [[5, 6, 11, 12, 13]], [[3, 4, 7, 8, 9]]
    bmap = read_map(call_of(ids, pos, cu_q=[0, 2, 2, 5], rows=(8, 9)))
    assert [(s.seq, s.start, s.length, s.keys) for s in bmap.segments] == [(8, 0, 2, None), (9, 2, 3, None)]
    assert bmap.source == "cu_seq_lens" and bmap.packed
    keyed = read_map(call_of(ids, pos, cu_q=[0, 2, 5], cu_k=[0, 5, 15]))
    assert [s.keys for s in keyed.segments] == [(0, 5), (5, 15)]
    # The empty sequence's keys are its own: those after it keep theirs.
    gap = read_map(call_of(ids, pos, cu_q=[0, 2, 2, 5], cu_k=[0, 5, 9, 15]))
    assert [(s.start, s.length, s.keys) for s in gap.segments] == [(0, 2, (0, 5)), (2, 3, (9, 15))]


def test_declared_query_lengths_come_first_and_must_fit() -> None:
    ids, pos = [[5, 6, 7, 11, 12]], [[0, 1, 2, 0, 1]]
    call = call_of(ids, pos, query_lens=[1, 4], cu_q=[0, 3, 5])  # the declaration wins over cu_seq_lens_q
    assert cut(call) == [(None, 0, 0, 1), (None, 0, 1, 4)] and read_map(call).source == "declared"
    assert cut(call_of(ids, pos, query_lens=[2, 3])) == [(None, 0, 0, 2), (None, 0, 2, 3)]  # all of it
    assert (
        "query lengths [3, 3] do not fit the call's 5 query tokens"
        in read_map(call_of(ids, pos, query_lens=[3, 3])).unreadable
    )  # a value, not an exception
    assert "do not fit" in read_map(call_of(ids, pos, query_lens=[5, 0])).unreadable


def test_restarting_positions_cut_only_an_unmasked_call_without_cache() -> None:
    """transformers' rule: a position that is not the previous one plus one starts a sequence; it
    applies with no mask and nothing cached (else the mask or the cache says who attends what)."""
    ids, pos = [[5, 6, 7, 11, 12, 13]], [[0, 1, 2, 0, 1, 2]]
    assert cut(call_of(ids, pos)) == [(None, 0, 0, 3), (None, 0, 3, 3)]
    assert read_map(call_of(ids, pos)).source == "positions"
    assert cut(call_of(ids, [[4, 5, 6, 7, 8, 9]])) == [(None, 0, 0, 6)]  # one run: not packed
    assert cut(call_of(ids, pos, cache_width=4)) == [(None, 0, 0, 6)]
    assert cut(call_of(ids, pos, positions_fed=False)) == [(None, 0, 0, 6)]
    assert cut(call_of(ids, pos, packed=False)) == [(None, 0, 0, 6)]
    two = call_of([[5, 6], [7, 8]], [[0, 0], [0, 1]])  # B = 2: padded rows, whatever the positions
    assert cut(two) == [(None, 0, 0, 2), (None, 1, 0, 2)]


def test_a_block_diagonal_mask_over_a_shared_cache_cuts_where_a_token_starts_over() -> None:
    """Two sequences with 2 and 3 cached slots (keys 0-1 and 2-4), one query token each after
    them (keys 5 and 6): the second token drops the first's slots and restarts its position."""
    mask = torch.zeros(2, 7, dtype=torch.bool)
    mask[0, [0, 1, 5]] = True
    mask[1, [2, 3, 4, 6]] = True
    lines = line_summary(mask)
    call = call_of([[9, 19]], [[2, 3]], mask_kind="4d", lines=lines, cache_width=5, rows=(3, 1))
    assert cut(call) == [(3, 0, 0, 1), (1, 0, 1, 1)] and read_map(call).source == "block-mask"
    assert apply(call, read_map(call))
    assert all(isinstance(v, Counted) for v in call.views) and call.cache_width == 3
    assert [v.cache for v in call.views] == [2, 3]
    assert [call.views[r].before(0) for r in range(2)] == [2, 3]
    # A causal block (no token drops a slot the one before it attended): one sequence.
    single = call_of([[9, 19]], [[2, 3]], mask_kind="4d", lines=line_summary(torch.tril(torch.ones(2, 2)) > 0))
    assert cut(single) == [(None, 0, 0, 2)]


def test_declared_rows_that_exceed_a_single_row_are_unreadable_for_the_target_only() -> None:
    one = call_of([[5, 6, 7]], [[0, 1, 2]], rows=(0, 1))
    assert (
        "rows declares 2 sequences; its one row is not packed" in read_map(one).unreadable
    )  # a value, not an exception
    varlen = call_of([[5, 6, 7, 8]], [[0, 1, 0, 1]], cu_q=[0, 2, 4], rows=(0, 1, 2))
    assert (
        "rows declares 3 sequences; its cu_seq_lens holds 2" in read_map(varlen).unreadable
    )  # a value, not an exception
    one.role = "draft"  # a draft call's declaration of another size is only the default order
    assert cut(one) == [(None, 0, 0, 3)]
    padded = call_of([[5, 6], [7, 8]], [[0, 1], [0, 1]], rows=(0, 1, 2))  # B = 2: the default order
    assert cut(padded) == [(None, 0, 0, 2), (None, 1, 0, 2)]


def test_apply_leaves_a_padded_call_as_it_is_and_names_its_rows() -> None:
    call = call_of([[5, 6], [7, 8]], [[0, 1], [0, 1]], rows=(3, 4))
    ids = [list(r) for r in call.input_ids]
    bmap = read_map(call)
    assert not apply(call, bmap)
    assert call.rows == (3, 4) and bmap.source == "padded" and call.input_ids == ids and call.batch_size == 2
    partly = call_of([[5, 6], [7, 8]], [[0, 1], [0, 1]])
    apply(partly, BatchMap((Segment(3, 0, 0, 2), Segment(None, 1, 0, 2)), "declared"))
    assert partly.rows is None  # a row without a declared sequence: the default order for all


def test_apply_unpacks_a_position_cut_call_causally_within_each_sequence() -> None:
    """No mask, no cache, positions restarting: each token attends its own sequence's tokens up to
    itself (counts 1, 2, 3 and 1, 2); the kept argmax (last 2 columns) lands at its column."""
    call = call_of([[5, 6, 7, 11, 12]], [[0, 1, 2, 0, 1]], argmax=[[40, 41]])
    assert apply(call, read_map(call))
    assert call.input_ids == [[5, 6, 7], [11, 12, 0]] and call.positions == [[0, 1, 2], [0, 1, 0]]
    assert [v.flags for v in call.views] == [[1, 1, 1], [1, 1, 0]]
    assert call.argmax == [[None, None, None], [40, 41, None]]
    assert [[n for n, _ in v.counts] for v in call.views] == [[1, 2, 3], [1, 2, 0]]
    assert [[one_more for _, one_more in v.counts] for v in call.views] == [[False, True, True], [False, True, False]]
    assert (
        [v.last for v in call.views] == [2, 1]
        and call.segments == [(0, 0, 3), (0, 3, 2)]
        and [v.cache for v in call.views] == [0, 0]
    )
    assert call.batch_size == 2 and call.query_len == 3 and call.logit_slots is None


def test_apply_without_keys_or_a_readable_mask_leaves_the_mask_unread() -> None:
    """cu_seq_lens_q without cu_seq_lens_k over a cache: nothing says which slots each attends,
    so the rows carry no mask (its checks are skipped, never guessed)."""
    call = call_of([[5, 6, 7]], [[4, 2, 3]], cu_q=[0, 1, 3], cache_width=6, argmax=[[7, 8, 9]])
    assert apply(call, read_map(call))
    assert call.mask is None and [v.cache for v in call.views] == [0, 0]
    assert [type(v) for v in call.views] == [View, View] and call.views[1].before(1) == -1
    assert call.argmax == [[7, None], [8, 9]] and call.held is None
