"""The batch map's own rules (`specviz/watch/map.py`), one at a time: which segments and maps a
producer may build (a malformed one is a ValueError or TypeError where it is built, never a map
the checks then misread), what a segment says per token, and when a map is packed. Every
expected value is worked out by hand in the test."""

from __future__ import annotations

import pytest

# The code under test, in one block.
from specviz.watch.map import BatchMap, Segment, tree_error

# ----------------------------------------------------------------------------- trees


def test_tree_error_accepts_trees_and_names_what_is_wrong() -> None:
    assert tree_error([-1]) is None  # the pending token alone
    assert tree_error([-1, 0, 0, 1]) is None  # two children of the root, one grandchild
    assert tree_error((-1, 0, 1, 2)) is None  # a chain, given as a tuple
    assert tree_error([]) == "a tree is a non-empty list of parent indices"
    assert tree_error(None) == "a tree is a non-empty list of parent indices"
    assert tree_error("-1") == "a tree is a non-empty list of parent indices"
    assert tree_error([-1, True]) == "parent indices must be integers"  # bool is no index
    assert tree_error([-1, 0.0]) == "parent indices must be integers"
    assert tree_error([0]) == "node 0 (the pending token) must be the root, parent -1"
    assert tree_error([-1, 1]) == "each node's parent must be an earlier node"  # its own parent
    assert tree_error([-1, 0, 3, 0]) == "each node's parent must be an earlier node"  # a later one
    assert tree_error([-1, -1]) == "each node's parent must be an earlier node"  # a second root
    assert tree_error([-1, 0, 1]) is None  # node 2's parent 1: the last earlier node is allowed


# ----------------------------------------------------------------------------- segments


def test_a_segment_needs_a_row_a_start_and_a_length() -> None:
    Segment(0, 0, 0, 1)  # the least: one query token at column 0 of row 0
    Segment(None, 3, 5, 2)  # a sequence not said, anywhere in the call
    for row, start, length in ((0, 0, 0), (0, 0, -1), (0, -1, 1), (-1, 0, 1)):
        with pytest.raises(ValueError, match="row >= 0, start >= 0 and length > 0"):
            Segment(0, row, start, length)


def test_drafts_are_fewer_than_the_query_and_a_chunk_has_none() -> None:
    Segment(0, 0, 0, 3, drafts=2)  # pending + 2 drafts
    Segment(0, 0, 0, 3, drafts=0)
    for drafts in (3, 4, -1):  # 3 drafts in 3 tokens leave no pending token
        with pytest.raises(ValueError, match="cannot carry"):
            Segment(0, 0, 0, 3, drafts=drafts)
    Segment(0, 0, 0, 3, chunk=True)
    Segment(0, 0, 0, 3, drafts=0, chunk=True)  # a chunk that says 0 drafts is fine
    with pytest.raises(ValueError, match="a prefill chunk carries no drafts"):
        Segment(0, 0, 0, 3, drafts=1, chunk=True)


def test_own_keys_are_an_interval() -> None:
    Segment(0, 0, 0, 2, keys=(0, 0))  # empty: lo == hi
    Segment(0, 0, 0, 2, keys=(4, 9))
    for keys in ((5, 4), (-1, 3)):
        with pytest.raises(ValueError, match=r"\[lo, hi\)"):
            Segment(0, 0, 0, 2, keys=keys)


def test_positions_and_writes_are_one_int_per_query_token_reads_any_number() -> None:
    s = Segment(0, 0, 0, 2, positions=(7, 8), writes=(70, 71), reads=(1, 2, 3, 70, 71))
    assert s.positions == (7, 8) and s.reads == (1, 2, 3, 70, 71)
    Segment(0, 0, 0, 2, reads=())  # no slot read: allowed
    with pytest.raises(ValueError, match="Segment.positions has 1 entries for 2 query tokens"):
        Segment(0, 0, 0, 2, positions=(7,))
    with pytest.raises(ValueError, match="Segment.writes has 3 entries for 2 query tokens"):
        Segment(0, 0, 0, 2, writes=(1, 2, 3))
    with pytest.raises(TypeError, match="Segment.positions must be a tuple of ints"):
        Segment(0, 0, 0, 2, positions=[7, 8])  # a list, not a tuple
    with pytest.raises(TypeError, match="Segment.writes must be a tuple of ints"):
        Segment(0, 0, 0, 2, writes=(1, True))  # bool is no slot
    with pytest.raises(TypeError, match="Segment.reads must be a tuple of ints"):
        Segment(0, 0, 0, 2, reads=(1.0,))
    with pytest.raises(TypeError, match="Segment.parents must be a tuple of ints"):
        Segment(0, 0, 0, 2, parents=[-1, 0])


def test_parents_are_a_tree_of_at_most_the_query_tokens() -> None:
    Segment(0, 0, 0, 3, parents=(-1, 0, 0))  # pending token and two sibling drafts
    Segment(0, 0, 0, 5, parents=(-1, 0))  # the tree is the last 2 of 5 tokens
    Segment(0, 0, 0, 1, parents=())  # no node: nothing to check
    with pytest.raises(ValueError, match="no tree"):
        Segment(0, 0, 0, 2, parents=(-1, 0, 0))  # 3 nodes in 2 tokens
    with pytest.raises(ValueError, match="no tree"):
        Segment(0, 0, 0, 3, parents=(0, 0, 0))  # no root
    with pytest.raises(ValueError, match="no tree"):
        Segment(0, 0, 0, 3, parents=(-1, 2, 0))  # node 1's parent later than itself


def test_columns_are_the_segments_own() -> None:
    assert Segment(0, 1, 4, 3).columns == range(4, 7)
    assert list(Segment(0, 0, 0, 1).columns) == [0]


def test_roles_of_a_chunk_and_of_a_segment_without_drafts_said() -> None:
    assert Segment(0, 0, 0, 3, chunk=True).roles() == ["context"] * 3
    assert Segment(0, 0, 0, 3).roles() == []
    assert Segment(0, 0, 0, 3, drafts=0).roles() == ["context", "context", "pending"]
    assert Segment(0, 0, 2, 3, drafts=2).roles() == ["pending", "draft", "draft"]


# ----------------------------------------------------------------------------- maps


def test_an_unread_map_is_a_reason_and_no_segments() -> None:
    m = BatchMap.unread("paged", "no block table")
    assert m.segments == () and m.source == "paged" and m.unreadable == "no block table"
    assert not m.readable
    assert BatchMap((Segment(0, 0, 0, 1),), "declared").readable
    assert BatchMap((), "declared").readable  # nothing in it, but read
    with pytest.raises(ValueError, match="an unreadable map has no segments"):
        BatchMap((Segment(0, 0, 0, 1),), "paged", "no block table")


def test_a_sequence_is_in_one_segment_of_a_call() -> None:
    BatchMap((Segment(0, 0, 0, 2), Segment(1, 1, 0, 2)), "padded")
    BatchMap((Segment(None, 0, 0, 2), Segment(None, 1, 0, 2)), "padded")  # not said: no clash
    with pytest.raises(ValueError, match="a sequence appears twice in one forward"):
        BatchMap((Segment(0, 0, 0, 2), Segment(0, 1, 0, 2)), "padded")


def test_segments_of_one_row_do_not_overlap() -> None:
    # Row 0 holds [0, 3) and [3, 5): they touch, they do not overlap.
    BatchMap((Segment(0, 0, 0, 3), Segment(1, 0, 3, 2)), "cu_seq_lens")
    BatchMap((Segment(1, 0, 3, 2), Segment(0, 0, 0, 3)), "cu_seq_lens")  # in any order
    BatchMap((Segment(0, 0, 0, 3), Segment(1, 1, 0, 3)), "padded")  # other rows: the same columns
    with pytest.raises(ValueError, match="segments overlap in row 0"):
        BatchMap((Segment(0, 0, 0, 3), Segment(1, 0, 2, 2)), "cu_seq_lens")  # column 2 twice
    with pytest.raises(ValueError, match="segments overlap in row 1"):
        BatchMap((Segment(0, 0, 0, 1), Segment(1, 1, 4, 1), Segment(2, 1, 0, 5)), "cu_seq_lens")


def test_packed_is_two_sequences_in_a_row_or_one_not_at_column_0() -> None:
    assert not BatchMap((Segment(0, 0, 0, 3), Segment(1, 1, 0, 3)), "padded").packed
    assert not BatchMap((Segment(0, 0, 0, 3),), "padded").packed
    assert not BatchMap((), "padded").packed
    assert BatchMap((Segment(0, 0, 0, 3), Segment(1, 0, 3, 2)), "cu_seq_lens").packed
    assert BatchMap((Segment(0, 0, 2, 3),), "declared").packed  # one sequence, from column 2
    assert BatchMap((Segment(0, 0, 0, 3), Segment(1, 1, 1, 2)), "declared").packed
