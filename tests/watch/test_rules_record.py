"""One captured call at close (`specviz/watch/record.py`): `materialize` turns the hooks' tensors
into lists once and reads the call's map (a packed call becomes one row per sequence), and a row's
query flags (which query slots hold real tokens), last real slot and cache are read off its mask.
Every call is written by hand, with what a correct engine feeds and what each reading must be."""

from __future__ import annotations

import torch

# The code under test, in one block.
from specviz.watch.record import CallRecord
from specviz.watch.view import Counted, Slotted


def call(ids, mask, kind: str, width: int = 0, **fields) -> CallRecord:
    ids = torch.tensor(ids)
    b, q = ids.shape
    record = CallRecord(
        role="target", rows=None, input_ids=ids, positions=torch.arange(width, width + q).repeat(b, 1),
        positions_fed=True, cache_width=width, mask_kind=kind, mask=mask, batch_size=b, query_len=q,
    )  # fmt: skip
    for name, value in fields.items():
        setattr(record, name, value)
    return record


def causal(*lengths: int) -> torch.Tensor:
    """A block-diagonal causal [T, T] boolean mask of sequences of these lengths, back to back."""
    t = sum(lengths)
    mask = torch.zeros(t, t, dtype=torch.bool)
    start = 0
    for n in lengths:
        mask[start : start + n, start : start + n] = torch.ones(n, n, dtype=torch.bool).tril()
        start += n
    return mask


# ----------------------------------------------------------------------------- query flags


def test_a_left_padded_2d_batch() -> None:
    """Row 0 is one token shorter: its first query slot is padding. Both rows' last slot is real."""
    c = call([[0, 5, 6], [7, 8, 9]], torch.tensor([[0, 1, 1], [1, 1, 1]]), "2d")
    c.materialize()
    assert c.input_ids == [[0, 5, 6], [7, 8, 9]] and c.mask == [[0, 1, 1], [1, 1, 1]]
    assert c.views[0].flags == [0, 1, 1] and c.views[1].flags == [1, 1, 1]
    assert c.last_slots == [2, 2]
    assert c.map.source == "padded" and [s.row for s in c.map.segments] == [0, 1]


def test_a_right_padded_2d_batch_with_a_cache() -> None:
    """A cache of 2 slots, then 3 query slots: row 0's last query slot is padding (mask 0), so its
    last real slot is 1; the flags are the mask's last 3 entries."""
    c = call([[5, 6, 0], [7, 8, 9]], torch.tensor([[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]]), "2d", width=2)
    c.materialize()
    assert c.views[0].flags == [1, 1, 0] and c.views[1].flags == [1, 1, 1]
    assert c.last_slots == [1, 2]
    assert c.views[0].cache == 2 and c.views[1].cache == 2


def test_a_2d_mask_narrower_than_the_query_says_nothing_of_it() -> None:
    c = call([[5, 6, 7]], torch.tensor([[1, 0]]), "2d")
    c.materialize()
    assert c.views[0].flags == [1, 1, 1] and c.last_slots == [2]


def test_a_4d_row_is_read_by_which_query_slots_attend_anything() -> None:
    """Row 0's first slot attends nothing (padding); row 1 attends nothing at all: it feeds nothing,
    its flags all 0, and its last slot is then the last one."""
    c = call([[0, 5, 6], [0, 0, 0]], None, "4d", query_live=torch.tensor([[False, True, True], [False, False, False]]))
    c.materialize()
    assert c.query_live == [[False, True, True], [False, False, False]]
    assert c.views[0].flags == [0, 1, 1] and c.views[1].flags == [0, 0, 0]
    assert c.last_slots == [2, 2]
    slots = call([[0, 5]], None, "4d-slots", query_live=[[False, False]])
    slots.materialize()
    assert slots.views[0].flags == [0, 0]


def test_a_row_of_another_mask_with_no_live_slot_is_all_real() -> None:
    """Where the mask is of no kind the hooks read (unknown), a live list with nothing live says
    nothing: every slot is a token. One with a live slot says which."""
    c = call([[5, 6], [7, 8]], None, "unknown", query_live=[[False, False], [True, False]])
    c.materialize()
    assert c.views[0].flags == [1, 1] and c.views[1].flags == [1, 0]
    assert c.last_slots == [1, 0]
    plain = call([[5, 6]], None, "none")
    plain.materialize()
    assert plain.views[0].flags == [1, 1] and plain.last_slots == [1]


def test_view_flags_are_read_once_and_shared() -> None:
    c = call([[0, 5]], torch.tensor([[0, 1]]), "2d")
    c.materialize()
    first = c.views[0].flags
    c.mask = [[1, 1]]  # nothing changes a materialized call's mask: the flags were read already
    assert c.views[0].flags is first and first == [0, 1]


# ----------------------------------------------------------------------------- materialize


def test_materialize_runs_once() -> None:
    c = call([[5, 6]], torch.tensor([[1, 1]]), "2d")
    c.materialize()
    c.input_ids = torch.tensor([[9, 9]])  # a second close reads nothing again
    c.materialize()
    assert isinstance(c.input_ids, torch.Tensor)


def test_every_tensor_field_becomes_lists() -> None:
    c = call([[5, 6]], torch.tensor([[1, 1]]), "2d", argmax=torch.tensor([[7]]))
    c.materialize()
    assert c.positions == [[0, 1]] and c.argmax == [[7]] and not isinstance(c.mask, torch.Tensor)


def test_kept_logits_are_spread_over_their_columns() -> None:
    """logits_to_keep kept columns 0 and 2 of 3: the argmax is None at column 1."""
    c = call([[5, 6, 7]], None, "none", argmax=torch.tensor([[40, 42]]), logit_slots=torch.tensor([0, 2]))
    c.materialize()
    assert c.argmax == [[40, None, 42]] and c.logit_slots is None


def test_a_packed_4d_call_becomes_one_row_per_sequence() -> None:
    """Two sequences packed in one row (3 then 2 tokens, block-diagonal causal, no cache): cut by
    the mask into two rows; each keeps its first and last token's key slots."""
    ids = [[5, 6, 7, 11, 12]]
    c = call(ids, causal(3, 2)[None], "4d", packed=True, positions=torch.tensor([[0, 1, 2, 0, 1]]))
    c.materialize()
    assert c.map.source == "block-mask" and [(s.start, s.length) for s in c.map.segments] == [(0, 3), (3, 2)]
    assert c.batch_size == 2 and c.input_ids == [[5, 6, 7], [11, 12, 0]]
    assert c.views[0].flags == [1, 1, 1] and c.views[1].flags == [1, 1, 0]
    assert c.last_slots == [2, 1]
    assert c.segments == [(0, 0, 3), (0, 3, 2)]
    (a_first, a_last), (b_first, b_last) = c.held
    assert a_first.tolist() == [True, False, False, False, False]
    assert a_last.tolist() == [True, True, True, False, False]
    assert b_first.tolist() == [False, False, False, True, False]
    assert b_last.tolist() == [False, False, False, True, True]
    assert c.keys_end == 5  # keys [cache | query]: 0 + 5
    assert c.node_keys is None  # no tree packed
    assert all(isinstance(v, Counted) for v in c.views) and c.mask is None and c.lines is None
    assert c.views[1].counts == [(1, False), (2, True), (0, False)]  # per slot: attended, one more


def test_a_packed_call_with_one_sequence_is_read_as_any_4d_mask() -> None:
    """One causal sequence in a 1 x 3 call: nothing cuts it, so its mask is kept as a 4-D row."""
    c = call([[5, 6, 7]], causal(3)[None], "4d", packed=True)
    c.materialize()
    assert c.batch_size == 1 and c.map.source == "padded"
    assert c.mask == [causal(3).tolist()]
    assert c.held is None and c.last_slots == [2] and c.views[0].flags == [1, 1, 1]


def test_a_packed_call_whose_first_slot_attends_nothing() -> None:
    """One sequence after a padding slot (its mask line attends nothing) in a packed 1 x 3 call:
    nothing cuts it, and the hooks kept no live list: the mask's summary says slot 0 is padding."""
    mask = torch.zeros(3, 3, dtype=torch.bool)
    mask[1:, 1:] = causal(2)
    c = call([[0, 5, 6]], mask[None], "4d", packed=True, positions=torch.tensor([[0, 0, 1]]))
    c.materialize()
    assert c.batch_size == 1 and c.query_live == [[False, True, True]]
    assert c.views[0].flags == [0, 1, 1] and c.last_slots == [2]


def test_a_packed_call_over_a_cache_keeps_where_its_keys_end() -> None:
    """Keys [cache of 2 | 5 query slots]: sequence A (3 tokens) attends the cache and its own keys,
    B (2 tokens) only its own. The next call's view of node slots is read from key 7 on. A mask over
    a static cache's 8 slots (not cache + query) says nothing of where the keys end."""
    a = [[1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0]]
    b = [[0, 0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 1, 1]]
    mask = torch.tensor([a + b], dtype=torch.bool)
    positions = torch.tensor([[2, 3, 4, 0, 1]])
    c = call([[5, 6, 7, 11, 12]], mask, "4d", width=2, packed=True, positions=positions)
    c.materialize()
    assert [(s.start, s.length) for s in c.map.segments] == [(0, 3), (3, 2)]
    assert c.keys_end == 7
    static = torch.cat([mask, torch.zeros(1, 5, 1, dtype=torch.bool)], -1)  # 8 slots
    s = call([[5, 6, 7, 11, 12]], static, "4d", width=2, packed=True, positions=positions)
    s.materialize()
    assert s.batch_size == 2 and s.keys_end is None


def test_a_packed_call_that_declares_trees_keeps_each_rows_own_slots() -> None:
    """Declared query lengths 3 and 2 and declared trees (chains here): each row is read as a
    static cache's slots (`Slotted`), so its declared tree can be checked against them, and each
    sequence's node keys are where its first query token sits."""
    c = call([[5, 6, 7, 11, 12]], causal(3, 2)[None], "4d", packed=True, positions=torch.tensor([[0, 1, 2, 0, 1]]))
    c.query_lens, c.parents = [3, 2], [[-1, 0, 1], [-1, 0]]
    c.materialize()
    assert c.unreadable is None and c.batch_size == 2
    assert all(isinstance(v, Slotted) for v in c.views)
    assert c.views[1].lines == [[True, False], [True, True], [False, False]]
    assert c.node_keys == [0, 3]
    assert c.trees == [[-1, 0, 1], [-1, 0]]


def test_an_unreadable_call_says_what_its_producer_said() -> None:
    """cu_seq_lens_q cuts the packed row into two sequences, but the engine declared three rows: the
    call is unreadable with the producer's reason, whatever an earlier reading said."""
    c = call([[5, 6, 7, 11, 12]], None, "none", packed=True, cu_q=torch.tensor([0, 3, 5]), rows=(0, 1, 2))
    c.unreadable = "an earlier reading"
    c.materialize()
    assert not c.map.readable
    assert c.unreadable == c.map.unreadable == "rows declares 3 sequences; its cu_seq_lens holds 2"


# ----------------------------------------------------------------------------- trees and reasons


def test_declared_trees_of_a_packed_call_fed_no_mask_are_read() -> None:
    """cu_seq_lens_q cuts a 1 x 5 call fed no mask (FlashAttention varlen) into a tree of three
    nodes and a chain of two, both declared: each segment's row keeps its declared tree (nothing
    in a mask could say it, so only a declaration does)."""
    c = call([[5, 6, 8, 11, 12]], None, "none", cu_q=torch.tensor([0, 3, 5]), packed=True)
    c.parents = [[-1, 0, 0], [-1, 0]]
    c.materialize()
    assert c.map.source == "cu_seq_lens" and c.batch_size == 2 and c.unreadable is None
    assert c.trees == [[-1, 0, 0], [-1, 0]]


def test_a_declared_tree_in_one_row_is_not_cut_by_its_mask() -> None:
    """A 1 x 3 call declaring one tree (no query lengths): one row verifying it, whatever its mask
    shows (here a chain, which `tree.one_tree` does not read as a tree): never cut into sequences."""
    c = call([[5, 6, 7]], causal(3)[None], "4d", packed=True)
    c.parents = [[-1, 0, 1]]
    c.materialize()
    assert not c.packed and c.batch_size == 1 and c.lines is None
    assert c.trees == [[-1, 0, 1]] and c.views[0].flags == [1, 1, 1]


def test_one_tree_in_a_packed_call_keeps_its_mask_for_the_tree_reading() -> None:
    """A 1 x 3 call whose mask is one branching tree fed its depths (node 0 the root, nodes 1 and 2
    its children): one row, not two sequences; its mask is kept whole so the tree is read from it."""
    tree_mask = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], dtype=torch.bool)
    c = call([[5, 6, 8]], tree_mask, "4d", width=2, packed=True, positions=torch.tensor([[2, 3, 3]]))
    c.mask = torch.cat([torch.ones(1, 3, 2, dtype=torch.bool), tree_mask], -1)  # keys [cache 2 | query 3]
    c.materialize()
    assert not c.packed and c.lines is None and c.batch_size == 1
    assert c.trees == [[-1, 0, 0]]


def test_the_first_reason_a_call_is_unreadable_stands() -> None:
    c = call([[5, 6]], None, "none")
    c.mark_unreadable("the map's producer could not read it")
    c.mark_unreadable("a later reading")
    assert c.unreadable == "the map's producer could not read it"


def test_a_declared_tree_past_the_kept_mask_lines_is_not_read_from_the_mask() -> None:
    """A 4-D mask keeps its last QUERY_TAIL query lines. A right-padded row whose declared tree
    sits before them: the tree stands as declared, its mask reading (node views, the root's
    view) says "not read" instead of reading another slot's line."""
    from specviz.watch.calls import RowQuery, row_read
    from specviz.watch.tensor_reads import QUERY_TAIL

    q = QUERY_TAIL + 3
    flags = [True] * 3 + [False] * QUERY_TAIL  # the tree's 3 nodes, then padding
    kept = [[bool(j <= i) for j in range(q)] for i in range(3, q)]  # lines of slots 3 .. q-1 only
    for kind in ("4d", "4d-slots"):
        c = call([[5, 6, 8] + [0] * QUERY_TAIL], [kept], kind, query_live=[flags])
        c.parents = [[-1, 0, 0]]
        c.materialize()
        assert c.trees == [[-1, 0, 0]] and c.last_slots == [2]
        read = row_read([c], 0, 0, 0, RowQuery(0, 2, ()), False)
        assert (read.runs, read.context, read.attends) == ([], -1, None)
