"""A row's view (`specviz/watch/view.py`): what one row of a call feeds and attends, read from the
mask it was fed, whatever its kind. Every mask is written by hand, with what a correct engine's
row reads as and what a buggy row (a stale slot, a missing self slot, a line not kept) reads as."""

from __future__ import annotations

import torch

# The code under test, in one block.
from specviz.watch.record import CallRecord
from specviz.watch.view import Counted, Keyed, Padded, Slotted, Unmasked, View, parents_of_sets, read_views


def lines(*rows: str) -> list[list[bool]]:
    return [[c == "1" for c in row] for row in rows]


# A cache of 2 slots then a query of 3: the pending token and two drafts, a causal chain.
CHAIN = lines("11100", "11110", "11111")
# A cache of 2 then a tree of 4 nodes, parents [-1, 0, 0, 1]: node 2 does not see node 1.
TREE = lines("111000", "111100", "111010", "111101")
TREE_PARENTS = [-1, 0, 0, 1]


# ----------------------------------------------------------------------------- no mask / unread


def test_the_last_real_slot_of_a_row() -> None:
    """The last slot whose flag is 1; the last slot of all when none is."""
    assert View([1, 1, 1], 0).last == 2
    assert View([1, 1, 0], 0).last == 1
    assert View([0, 1, 0], 0).last == 1
    assert View([1, 0, 0], 0).last == 0
    assert View([0, 0, 0], 0).last == 2
    assert View([0], 0).last == 0


def test_a_mask_that_cannot_be_read_says_nothing() -> None:
    """Nothing of what the row attends is guessed: -1, empty, None; its cache is what it was given."""
    v = View([1, 1, 0], 3)
    assert v.before(0) == -1 and v.before(1) == -1
    assert v.mask_row(0, 2) == ([], -1, None)
    assert not v.refed_root(0)
    assert v.tree(0, 2) is None and v.node_attends(0, 2) is None and v.tree_row(0, [-1, 0]) is None
    assert v.keys(0) is None
    assert v.attends_cache() and not View([1], 0).attends_cache()


def test_no_mask_attends_the_cache_and_the_query_up_to_itself() -> None:
    v = Unmasked([1, 1, 1], 3)
    assert [v.before(t) for t in range(3)] == [3, 4, 5]
    # Pending at slot 1 (slot 0 re-fed context), one draft: context = cache + 1, then both slots.
    assert v.mask_row(1, 2) == ([[1, 6]], 4, None)
    assert v.mask_row(0, 3) == ([[1, 6]], 3, None)


# ----------------------------------------------------------------------------- a 2-D mask


def test_a_left_padded_row_over_a_cache() -> None:
    """Columns [cache 2 | query 3], the query's first slot padding: the pending token (slot 1) sees
    both cached slots; its mask row is the context then the query slots."""
    v = Padded([0, 1, 1], 2, [1, 1, 0, 1, 1])
    assert v.before(1) == 2 and v.before(2) == 3
    assert v.mask_row(1, 2) == ([[1, 2], [0, 1], [1, 2]], 2, None)
    assert v.attends_cache()


def test_a_row_over_a_cache_of_one_slot_attends_it() -> None:
    """The first decode step after a one-token prompt: a cache of 1, its column on, the query after it."""
    v = Padded([1], 1, [1, 1])
    assert v.attends_cache() and v.before(0) == 1
    assert not Padded([1], 1, [0, 1]).attends_cache()  # the column off: a newcomer over it


def test_a_newcomer_over_a_shared_cache_attends_none_of_it() -> None:
    v = Padded([1, 1], 2, [0, 0, 1, 1])
    assert not v.attends_cache()
    assert v.before(0) == 0 and v.mask_row(0, 2) == ([[0, 2], [1, 2]], 0, None)


def test_a_row_given_no_cache_attends_none_of_it_whatever_its_2d_mask() -> None:
    """No cache, a 2-D mask narrower than the query (it says nothing of the query's first slot):
    the row attends no cache, although the mask's first column is on."""
    v = Padded([1, 1, 1], 0, [1, 0])
    assert not v.attends_cache()
    c = _call([[5, 6, 7]], torch.tensor([[1, 0]]), "2d")
    assert c.views[0].flags == [1, 1, 1] and not c.views[0].attends_cache()


# ----------------------------------------------------------------------------- a [cache | query] 4-D mask


def test_a_keyed_chain() -> None:
    v = Keyed([1, 1, 1], 2, CHAIN, 2)
    assert [v.before(t) for t in range(3)] == [2, 3, 4]
    assert v.mask_row(0, 3) == ([[1, 5]], 2, True)
    assert v.mask_row(1, 2) == ([[1, 5]], 3, True)
    assert v.tree(0, 3) == [-1, 0, 1]
    assert v.attends_cache() and not v.refed_root(0)
    assert v.keys(2) == CHAIN[2]


def test_a_keyed_chain_whose_draft_misses_its_pending_token_is_not_causal() -> None:
    """Draft 2 does not see draft 1 (a missing slot): the row is flagged, not read as causal."""
    v = Keyed([1, 1, 1], 2, lines("11100", "11110", "11101"), 2)
    assert v.mask_row(0, 3) == ([[1, 5]], 2, False)
    # A draft that also sees a later draft's key (a future slot) is not causal either.
    ahead = Keyed([1, 1, 1], 2, lines("11100", "11111", "11111"), 2)
    assert ahead.mask_row(0, 3)[2] is False


def test_a_keyed_pending_token_that_misses_its_own_key() -> None:
    v = Keyed([1, 1, 1], 2, lines("11000", "11110", "11111"), 2)
    assert v.mask_row(0, 3) == ([[1, 2], [0, 1], [1, 2]], 2, False)


def test_a_keyed_row_over_a_left_padded_cache() -> None:
    """Cache column 0 is padding: the row still attends its cache (column 1), and its root is not
    re-fed context."""
    v = Keyed([1, 1], 2, lines("0110", "0111"), 2)
    assert v.attends_cache()
    assert not v.refed_root(0)
    assert v.before(0) == 1 and v.mask_row(0, 2) == ([[0, 1], [1, 3]], 1, True)


def test_a_keyed_row_with_no_cache_is_rooted_at_re_fed_context() -> None:
    v = Keyed([1, 1, 1], 0, lines("100", "110", "111"), 0)
    assert v.refed_root(0) and not v.refed_root(1)
    assert not v.attends_cache()


def test_a_keyed_tree() -> None:
    v = Keyed([1, 1, 1, 1], 2, TREE, 2)
    assert v.tree(0, 4) == TREE_PARENTS
    assert v.node_attends(0, 4) == [[0], [0, 1], [0, 2], [0, 1, 3]]
    assert v.tree_row(0, TREE_PARENTS) == ([[1, 6]], 2)
    assert v.mask_row(0, 4)[2] is False  # a tree is no chain


def test_a_keyed_tree_node_that_misses_its_own_key() -> None:
    """Node 2 sees the root but not itself: its diagonal flag is 0, and no tree is read."""
    v = Keyed([1, 1, 1, 1], 2, lines("111000", "111100", "111000", "111101"), 2)
    assert v.tree_row(0, TREE_PARENTS) == ([[1, 4], [0, 1], [1, 1]], 2)
    assert v.tree(0, 4) is None


def test_a_keyed_line_not_kept_reads_as_unknown() -> None:
    """Only the last 2 query lines kept: the pending token's line (slot 0) is not read."""
    v = Keyed([1, 1, 1], 2, CHAIN[1:], 2)
    assert v.before(0) == -1 and v.before(1) == 3 and v.before(2) == 4
    assert v.mask_row(0, 3) == ([], -1, None)
    assert v.mask_row(1, 2) == ([[1, 5]], 3, True)
    assert v.tree(0, 3) is None and v.tree(1, 2) == [-1, 0]
    assert v.keys(0) is None and v.keys(1) == CHAIN[1]


# ----------------------------------------------------------------------------- a slot mask


def test_a_slotted_chain_over_a_static_cache() -> None:
    """A static cache of 6 slots: the row's cache in slots 0-1, its query in 2-4, slot 5 free."""
    v = Slotted([1, 1, 1], 2, lines("111000", "111100", "111110"))
    assert [v.before(t) for t in range(3)] == [2, 3, 4]
    assert v.attends_cache()
    assert v.mask_row(0, 3) == ([[1, 5]], 2, True)
    assert v.tree(0, 3) == [-1, 0, 1]


def test_a_recycled_static_slot_prefill_attends_none_of_its_cache() -> None:
    """Given a cache of 2, the prefill attends only its own 3 tokens (slots 2-4)."""
    v = Slotted([1, 1, 1], 2, lines("001000", "001100", "001110"))
    assert not v.attends_cache()
    assert v.refed_root(0) and not v.refed_root(1)


def test_a_row_given_no_cache_attends_none_whatever_its_mask() -> None:
    """No cache given: whatever slots the mask marks (a neighbour's), it attends no cache of its own."""
    v = Slotted([1, 1], 0, lines("1110", "1111"))
    assert not v.attends_cache()


def test_a_slotted_draft_that_misses_a_slot_is_not_causal() -> None:
    """Draft 2 misses draft 1's slot (3): its slots do not grow the ones before by one."""
    v = Slotted([1, 1, 1], 2, lines("111000", "111100", "111010"))
    assert v.mask_row(0, 3) == ([[1, 4], [0, 1]], 2, False)


def test_a_slotted_line_not_kept_reads_as_unknown() -> None:
    v = Slotted([1, 1, 1], 2, lines("111100", "111110"))
    assert v.before(0) == -1 and v.before(1) == 3
    assert v.mask_row(0, 3) == ([], -1, None)
    assert v.tree(0, 3) is None


def test_a_slotted_tree() -> None:
    """Cache slots 0-1, nodes in slots 2-5, parents [-1, 0, 0, 1]; node j attends j itself."""
    v = Slotted([1, 1, 1, 1], 2, TREE)
    assert v.tree(0, 4) == TREE_PARENTS
    assert v.node_attends(0, 4) == [[0], [0, 1], [0, 2], [0, 1, 3]]
    assert v.tree_row(0, TREE_PARENTS) == ([[1, 6]], 2)


def test_a_slotted_tree_node_that_misses_its_own_slot() -> None:
    """Node 2 attends only its parent's slots (not its own): read as 0 on the diagonal."""
    v = Slotted([1, 1, 1, 1], 2, lines("111000", "111100", "111000", "111101"))
    assert v.tree_row(0, TREE_PARENTS) == ([[1, 4], [0, 1], [1, 1]], 2)


def test_parents_of_sets() -> None:
    s = [frozenset(x) for x in ({0}, {0, 1}, {0, 2}, {0, 1, 3})]
    assert parents_of_sets(s) == [-1, 0, 0, 1]
    assert parents_of_sets(s[:2]) == [-1, 0]
    # A node whose set grows none of the earlier ones by one slot, or grows two: no tree.
    assert parents_of_sets([frozenset({0}), frozenset({0, 1, 2})]) is None
    assert parents_of_sets([frozenset({0}), frozenset({0, 1}), frozenset({0, 2}), frozenset({0, 1, 2})]) is None
    assert parents_of_sets([frozenset()]) is None and parents_of_sets([]) is None


# ----------------------------------------------------------------------------- a counted segment


def test_a_counted_segment() -> None:
    """Per slot: keys attended, and one more than the slot before. Correct: 3, 4, 5 growing."""
    v = Counted([1, 1, 1], 0, [(3, False), (4, True), (5, True)])
    assert [v.before(t) for t in range(3)] == [2, 3, 4]
    assert v.mask_row(0, 3) == ([[1, 5]], 2, True)


def test_a_counted_segment_with_a_stale_slot_is_flagged() -> None:
    """The last draft attends a slot instead of one more (its count does not grow)."""
    v = Counted([1, 1, 1], 0, [(3, False), (4, True), (4, False)])
    assert v.mask_row(0, 3) == ([[1, 4], [0, 1]], 2, False)


def test_a_pending_token_that_attends_no_key_misses_its_own_slot() -> None:
    """The pending token's line is all off (not even its own slot): it attends no context and not
    itself, so its diagonal starts with 0 and the block is not causal, read by counts (a packed
    segment's summary) or by slots alike; the draft after it attends its own slot only."""
    counted = Counted([1, 1], 0, [(0, False), (1, True)])
    assert counted.mask_row(0, 2) == ([[0, 1], [1, 1]], 0, False)
    slotted = Slotted([1, 1], 0, lines("0000", "0100"))
    assert slotted.mask_row(0, 2) == ([[0, 1], [1, 1]], 0, False)


# ----------------------------------------------------------------------------- a call's views


def _call(ids: list[list[int]], mask, kind: str, width: int = 0) -> CallRecord:
    b, q = len(ids), len(ids[0])
    c = CallRecord(
        role="target", rows=None, input_ids=torch.tensor(ids), positions=torch.arange(width, width + q).repeat(b, 1),
        positions_fed=True, cache_width=width, mask_kind=kind, mask=mask, batch_size=b, query_len=q,
    )  # fmt: skip
    c.materialize()
    return c


def test_each_mask_kind_gets_its_view() -> None:
    plain = _call([[5, 6], [7, 8]], None, "none", width=2)
    assert [type(v) for v in read_views(plain)] == [Unmasked, Unmasked]
    assert plain.views[1].before(1) == 3
    unknown = _call([[5, 6]], None, "unknown")
    assert [type(v) for v in read_views(unknown)] == [View]
    padded = _call([[0, 5, 6]], torch.tensor([[1, 1, 0, 1, 1]]), "2d", width=2)
    assert [type(v) for v in read_views(padded)] == [Padded] and padded.views[0].flags == [0, 1, 1]
    keyed = _call([[5, 6, 7]], torch.tensor([CHAIN]), "4d", width=2)
    assert [type(v) for v in read_views(keyed)] == [Keyed] and keyed.views[0].mask_row(0, 3) == ([[1, 5]], 2, True)
