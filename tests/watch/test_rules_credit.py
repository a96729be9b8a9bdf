"""Which row of a verify call produced each sequence's emitted tokens (`specviz/watch/tree.py`
`credit`, each row read by `calls.row_read`), on one call written by hand: its own row where the
tokens fit that row's drafts and the target's choices, else the row they fit (a write-back to the
wrong sequence then shows as `write_seq != seq_id`), split over rows where one sequence received
several rows' tokens.

The call has two rows, sequence 0 in row 0 and sequence 1 in row 1, each a pending token and one
draft: row 0 fed 10 then the draft 20 under argmax [20, 30] (a greedy engine emits 20, 30; 20, or
nothing, also fit it), row 1 fed 11 then 21 under argmax [20, 32] (it emits 20: draft refused)."""

from __future__ import annotations

# The code under test, in one block.
from specviz.watch.attribution import Group
from specviz.watch.calls import RowQuery, row_read
from specviz.watch.hooks import CallRecord
from specviz.watch.tree import credit

SHOWN = [RowQuery(0, 1, ()), RowQuery(0, 1, ())]  # each row: its pending token, then one draft


def verify(argmax_is_choice: bool = True) -> CallRecord:
    call = CallRecord(
        role="target", rows=(0, 1), input_ids=[[10, 20], [11, 21]], positions=[[3, 4], [3, 4]],
        positions_fed=True, cache_width=3, mask_kind="2d", mask=[[1] * 5, [1] * 5], batch_size=2,
        query_len=2, argmax=[[20, 30], [20, 32]], argmax_is_choice=argmax_is_choice,
    )  # fmt: skip
    call.materialize()
    return call


def assign_rows(call: CallRecord, groups: list[Group], shown: list[RowQuery], running: set[int]) -> dict[int, Group]:
    """The call's rows read as `shown`, then credited with the groups."""
    rows = [row_read([call], 0, r, seq, shown[r], False) for r, seq in enumerate(call.seq_ids)]
    return credit(rows, groups, running, not call.argmax_is_choice)


def group(seq: int, tokens: list[int], reason: str | None = None, cuts: list[int] | None = None) -> Group:
    return Group(seq, tokens, reason, 0, 0.0, cuts or [])


def placed(taken: dict[int, Group]) -> dict[int, tuple[int, list[int], str | None]]:
    return {r: (g.seq_id, g.tokens, g.finish_reason) for r, g in sorted(taken.items())}


def test_each_sequences_tokens_in_its_own_row() -> None:
    taken = assign_rows(verify(), [group(0, [20, 30]), group(1, [20], "eos")], SHOWN, {0, 1})
    assert placed(taken) == {0: (0, [20, 30], None), 1: (1, [20], "eos")}


def test_tokens_that_fit_their_own_row_stay_there_though_another_row_fits_them_too() -> None:
    """Sequence 0 emits 20, which row 1 (left without an emit) would also have given: row 0's."""
    assert placed(assign_rows(verify(), [group(0, [20])], SHOWN, {0, 1})) == {0: (0, [20], None)}


def test_tokens_written_to_the_wrong_sequence_are_the_row_they_fit() -> None:
    """Sequence 0 receives 21, row 1's draft (emitted without a choice after it), which row 0 does
    not explain (its draft is 20, its target chose 20): the token is row 1's, so the step shows
    row 1's token written to sequence 0. Where the argmax is not the engine's choice (it samples),
    a last token is anyone's: 21 then fits row 0, its own."""
    assert placed(assign_rows(verify(), [group(0, [21])], SHOWN, {0, 1})) == {1: (0, [21], None)}
    assert placed(assign_rows(verify(False), [group(0, [21])], SHOWN, {0, 1})) == {0: (0, [21], None)}
    # Row 1's sequence is not running (it left): its row is not offered, the token stays at row 0.
    assert placed(assign_rows(verify(), [group(0, [21])], SHOWN, {0})) == {0: (0, [21], None)}


def test_one_sequence_that_received_two_rows_tokens_is_split_where_its_emits_were_appended() -> None:
    """Sequence 0 receives [20] then [20, 30] in one step (two emits: cut after the first token),
    ending with EOS. No row explains all three. The first piece, 20, fits row 0 (tried first, its
    own) and row 1; given row 0, the rest, 20, 30, fits no row left, so the first piece is row
    1's and the rest row 0's, which carries the group's ending."""
    taken = assign_rows(verify(), [group(0, [20, 20, 30], "eos", cuts=[1])], SHOWN, {0, 1})
    assert placed(taken) == {0: (0, [20, 30], "eos"), 1: (0, [20], None)}


def test_tokens_no_row_explains_stay_at_their_own_row() -> None:
    taken = assign_rows(verify(), [group(1, [99, 98], "length", cuts=[1])], SHOWN, {0, 1})
    assert placed(taken) == {1: (1, [99, 98], "length")}


def test_a_late_group_places_after_the_on_time_ones() -> None:
    """Sequence 1 receives 20, 30 on time, which only row 0 explains (a write-back to the wrong
    sequence); sequence 0 receives 20 late (emitted after a newer call of its own), which fits row
    0 and row 1. The on-time group is read first and takes row 0; the late one then takes the row
    left, 1. (Read first, the late group would take its own row 0, leaving the on-time tokens no
    row that explains them.)"""
    late = Group(0, [20], None, 0, 0.0, late=True)
    taken = assign_rows(verify(), [group(1, [20, 30]), late], SHOWN, {0, 1})
    assert placed(taken) == {0: (1, [20, 30], None), 1: (0, [20], None)}


def test_a_late_group_that_fits_its_own_row_keeps_it_though_its_sequence_ended() -> None:
    """Sequence 0 (no longer running: it ended) receives 20 late, which fits its own row 0 and row 1:
    its own row is tried first, whole, as for an on-time group; only rows of running sequences are
    offered to a group that fits none of its own."""
    late = Group(0, [20], None, 0, 0.0, late=True)
    assert placed(assign_rows(verify(), [late], SHOWN, {1})) == {0: (0, [20], None)}
