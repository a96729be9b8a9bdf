"""A row's pending slot and draft chain (`specviz/watch/calls.py`): which draft calls proposed the
drafts a target call verifies, read on hand-built calls. Each call is what a correct engine (or a
buggy one: a draft that proposed another token, a draft fed the wrong position, a padded slot)
feeds, with the reading it must give."""

from __future__ import annotations

from specviz.watch.calls import CallReader, RowQuery, _prefills, attended_ids, draft_free_query, first_slot_query
from specviz.watch.record import CallRecord


def read_row(calls: list, index: int, row: int, seq: int | None = None) -> RowQuery:
    """Row `row` of target call `index` as one `CallReader` reads it (as sequence `seq`)."""
    return CallReader(calls)(index, row, seq)


def make(role: str, ids: list[list[int]], positions: list[list[int]], cache: int, **fields) -> CallRecord:
    b, q = len(ids), len(ids[0])
    call = CallRecord(
        role=role, rows=None, input_ids=ids, positions=positions, positions_fed=True, cache_width=cache,
        mask_kind=fields.pop("mask_kind", "none"), mask=fields.pop("mask", None), batch_size=b, query_len=q,
    )  # fmt: skip
    for name, value in fields.items():
        setattr(call, name, value)
    call.materialize()
    return call


def draft(fed: int, out: int, position: int, **fields) -> CallRecord:
    """A draft call of one row: fed one token at `position`, proposed `out`."""
    return make("draft", [[fed]], [[position]], position, argmax=[[out]], **fields)


def verify(ids: list[int], positions: list[int], cache: int = 3, **fields) -> CallRecord:
    return make("target", [ids], [positions], cache, **fields)


# ----------------------------------------------------------------------------- a row's draft chain


def test_a_chain_of_two_drafts() -> None:
    """Pending token 9 at position 3; the draft proposed 11, then (fed 11) 12; the verify feeds 9, 11, 12."""
    calls = [draft(9, 11, 3), draft(11, 12, 4), verify([9, 11, 12], [3, 4, 5])]
    assert read_row(calls, 2, 0) == RowQuery(0, 2, ((0, 0), (1, 0)))


def test_a_draft_that_proposed_another_token_is_no_chain() -> None:
    """The second draft call proposed 13, the verify feeds 12: no run of draft calls fits its
    tokens, so no drafts are read (the verify's last slot is the pending token)."""
    calls = [draft(9, 11, 3), draft(11, 13, 4), verify([9, 11, 12], [3, 4, 5])]
    assert read_row(calls, 2, 0) == RowQuery(2, 0, ())


def test_a_run_shorter_than_the_drafts_is_no_chain() -> None:
    """Only the second draft call fits the verify's first two tokens (7 then 8); two drafts need
    two calls: none is read."""
    calls = [draft(5, 6, 3), draft(7, 8, 3), verify([7, 8, 9], [3, 4, 5])]
    assert read_row(calls, 2, 0) == RowQuery(2, 0, ())


def test_more_draft_calls_than_the_query_holds() -> None:
    """Three draft calls, a verify of the pending token and one draft: the one draft is read."""
    calls = [draft(9, 11, 3), draft(11, 12, 4), draft(12, 13, 5), verify([9, 11], [3, 4])]
    assert read_row(calls, 3, 0) == RowQuery(0, 1, ((0, 0),))


def test_the_run_fed_the_query_s_positions_wins() -> None:
    """A catch-up call re-fed 9 at position 2 and proposed 11, then the proposal fed 9 at 3 proposed
    11 too: both fit the tokens; the one fed the verify's position is the chain."""
    calls = [draft(9, 11, 2), draft(9, 11, 3), verify([9, 11], [3, 4])]
    assert read_row(calls, 2, 0) == RowQuery(0, 1, ((1, 0),))


def test_a_draft_fed_the_wrong_position_is_still_its_chain() -> None:
    """The only draft call was fed position 2 for a pending token at 3 (a position bug): read as the
    chain, so the bug is checked, not hidden as "no drafts"."""
    calls = [draft(9, 11, 2), verify([9, 11], [3, 4])]
    assert read_row(calls, 1, 0) == RowQuery(0, 1, ((0, 0),))


def test_of_runs_fed_other_positions_the_earliest_is_the_chain() -> None:
    """Two draft calls each fed 9 and proposed 11, at positions 1 and 2, neither the verify's 3: both
    fit the tokens, none its positions; the earliest is read (its position bug checked)."""
    calls = [draft(9, 11, 1), draft(9, 11, 2), verify([9, 11], [3, 4])]
    assert read_row(calls, 2, 0) == RowQuery(0, 1, ((0, 0),))


def test_a_padding_slot_is_never_the_pending_token() -> None:
    """Left padding at slot 0 (token 0); a draft call that was fed the pad token and proposed 9
    must not make the padding the pending token: the pending token is slot 1 (9), one draft (11)."""
    mask = [[1, 1, 1, 0, 1, 1]]  # [cache 3 | query 3], query slot 0 padding
    calls = [draft(0, 9, 2), draft(9, 11, 3), verify([0, 9, 11], [0, 3, 4], mask_kind="2d", mask=mask)]
    assert read_row(calls, 2, 0) == RowQuery(1, 1, ((1, 0),))


def test_a_declared_draft_batch_with_twin_rows() -> None:
    """Two sequences fed the same token and proposed the same draft; the draft call declared its
    rows reversed: each sequence's draft row is its declared one, not told apart by tokens."""
    twin = make("draft", [[9], [9]], [[3], [3]], 3, rows=(9, 5), argmax=[[11], [11]])
    target = make("target", [[9, 11], [9, 11]], [[3, 4], [3, 4]], 3, rows=(5, 9))
    assert read_row([twin, target], 1, 0) == RowQuery(0, 1, ((0, 1),))
    assert read_row([twin, target], 1, 1) == RowQuery(0, 1, ((0, 0),))


def test_a_re_prefill_between_the_proposals_and_the_verify_is_passed_over() -> None:
    """The draft proposed 11; then the sequence was re-prefilled (a target call feeding its prompt
    again, no drafts); then the verify: its draft is the one before the re-prefill."""
    prefill = make("target", [[1, 2, 9]], [[0, 1, 2]], 0)
    calls = [draft(9, 11, 3), prefill, verify([9, 11], [3, 4])]
    assert read_row(calls, 2, 0) == RowQuery(0, 1, ((0, 0),))


def test_a_tree_row_is_read_from_its_nodes() -> None:
    """A declared tree of 3 nodes ending at the last slot: the pending token is node 0, the other
    nodes its drafts; no chain of draft calls is looked for."""
    calls = [draft(9, 11, 3), verify([9, 11, 12], [3, 4, 4], parents=[[-1, 0, 0]])]
    assert read_row(calls, 1, 0) == RowQuery(0, 2, ())
    over = [draft(9, 11, 3), verify([5, 9, 11, 12], [2, 3, 4, 4], parents=[[-1, 0, 0]])]
    assert read_row(over, 1, 0) == RowQuery(1, 2, ())


# ----------------------------------------------------------------------------- the rest of a row


def test_a_reader_reads_each_row_once() -> None:
    calls = [draft(9, 11, 3), draft(11, 12, 4), verify([9, 11, 12], [3, 4, 5])]
    reader = CallReader(calls)
    first = reader(2, 0)
    assert first == RowQuery(0, 2, ((0, 0), (1, 0)))
    assert reader(2, 0) is first and reader(2, 0, seq=0) == first


def test_rows_sequences_and_attended_ids() -> None:
    plain = make("target", [[7, 8, 9], [4, 5, 6]], [[0, 1, 2], [0, 1, 2]], 0)
    assert plain.seq_ids == (0, 1)
    assert attended_ids(plain, 0) == [7, 8, 9] and attended_ids(plain, 0, end=1) == [7, 8]
    assert attended_ids(plain, 1, end=0) == [4]


def test_a_reader_keeps_a_reading_across_sequences_only_where_they_share_it() -> None:
    """Read as two candidate sequences, an undeclared row has one reading (the same draft calls);
    where the draft call declared its rows, each sequence keeps the row it names."""
    twin = make("draft", [[9], [9]], [[3], [3]], 3, rows=(9, 5), argmax=[[11], [11]])
    target = make("target", [[9, 11], [9, 11]], [[3, 4], [3, 4]], 3, rows=(5, 9))
    reader = CallReader([twin, target])
    assert reader(1, 0, seq=5) == read_row([twin, target], 1, 0, seq=5) == RowQuery(0, 1, ((0, 1),))
    assert reader(1, 0, seq=9) == read_row([twin, target], 1, 0, seq=9) == RowQuery(0, 1, ((0, 0),))
    calls = [draft(9, 11, 3), verify([9, 11], [3, 4])]
    reader = CallReader(calls)
    assert reader(1, 0, seq=0) is reader(1, 0, seq=7)
    assert reader(1, 0, seq=7) == read_row(calls, 1, 0, seq=7) == RowQuery(0, 1, ((0, 0),))


def test_a_sampled_draft_row_fits_by_the_token_it_was_fed() -> None:
    """Where the argmax is not the engine's choice (it samples), a draft row is matched by the token
    it was fed alone: of a draft batch in another order, the one row fed the query's token."""
    sampled = make("draft", [[4], [9], [6]], [[2], [3], [5]], 3, argmax=[[1], [2], [3]], argmax_is_choice=False)
    calls = [sampled, verify([9, 11], [3, 4])]
    assert read_row(calls, 1, 0) == RowQuery(0, 1, ((0, 1),))
    assert read_row([sampled, verify([9, 12], [3, 4])], 1, 0) == RowQuery(0, 1, ((0, 1),))  # asked again
    chosen = make("draft", [[4], [9], [6]], [[2], [3], [5]], 3, argmax=[[1], [2], [3]])
    assert read_row([chosen, calls[1]], 1, 0) == RowQuery(1, 0, ())  # row 1 proposed 2, not 11


# ----------------------------------------------------------------------------- no draft model


def test_a_draft_free_row_with_a_masked_slot_among_its_drafts_reads_no_drafts() -> None:
    """No draft model (prompt lookup): committed [5, 6, 9], a cached row over 2 slots fed 9, 11, 13,
    12 whose 2-D mask leaves out the third query slot (13) only. The drafts after the pending 9 are
    not a run of real slots up to the last (by its layout from slot 0, nor by the count, from slot
    1): neither reading fits, so the row reads as no drafts (None), never as 9 and three drafts."""
    holed = verify([9, 11, 13, 12], [2, 3, 4, 5], cache=2, mask_kind="2d", mask=[[1, 1, 1, 1, 0, 1]])
    assert draft_free_query(holed, 0, [5, 6, 9]) is None
    # The same row with every slot real: the pending 9 at slot 0, then three drafts.
    whole = verify([9, 11, 13, 12], [2, 3, 4, 5], cache=2, mask_kind="2d", mask=[[1] * 6])
    assert draft_free_query(whole, 0, [5, 6, 9]) == RowQuery(0, 3, ())


def test_a_sampled_run_reads_its_chain_though_it_was_followed_as_greedy() -> None:
    """Following rows (before the steps) indexes a draft call's rows by (token fed, argmax); a run
    that samples then reads them with the argmax unsaid: the index is rebuilt, so the chain of two
    drafts is still read (a stale index found no row, and the step read no drafts)."""
    from specviz.watch.attribution import Emit
    from specviz.watch.steps import infer_steps

    prefill = make("target", [[1, 2, 9]], [[0, 1, 2]], 0, argmax=[[5, 6, 9]])
    calls = [prefill, draft(9, 11, 3), draft(11, 12, 4), verify([9, 11, 12], [3, 4, 5], argmax=[[11, 12, 13]])]
    assert CallReader(calls)(3, 0) == RowQuery(0, 2, ((1, 0), (2, 0)))  # indexed as greedy
    emits = [Emit(0, [9], None, 1, 0.0), Emit(0, [11, 12, 13], "length", 4, 0.0)]
    steps = infer_steps(calls, emits, [[1, 2]], frozenset(), argmax_is_choice=False)
    row = steps.steps[-1].rows[0]
    assert (row.draft_tokens, row.accepted) == ([11, 12], 2)


def test_a_draft_free_row_with_a_hole_in_its_re_fed_context_is_read_by_count() -> None:
    """No cache: the row re-feeds a, x, b, c (x masked out: a hole) and one draft d. By layout the
    pending token would sit at slot 2 (b, not c); by the count of attended slots it is at slot 3."""
    holed = verify([1, 99, 2, 3, 4], [0, 1, 1, 2, 3], cache=0, mask_kind="2d", mask=[[1, 0, 1, 1, 1]])
    assert draft_free_query(holed, 0, [1, 2, 3]) == RowQuery(3, 1, ())


def test_a_cached_row_s_first_real_slot_is_its_pending_token() -> None:
    """`first_slot_query`: after a padding slot, the pending token then two drafts; a row of one real
    slot is its pending token alone."""
    padded = verify([0, 9, 11, 12], [0, 3, 4, 5], mask_kind="2d", mask=[[1, 1, 1, 0, 1, 1, 1]])
    assert first_slot_query(padded, 0) == RowQuery(1, 2, ())
    alone = verify([0, 9], [0, 3], mask_kind="2d", mask=[[1, 1, 1, 0, 1]])
    assert first_slot_query(alone, 0) == RowQuery(1, 0, ())


def test_a_prefill_chunk_is_told_from_a_row_that_feeds_its_prompt_s_end() -> None:
    """`_prefills`: a row over 2 cached slots that feeds prompt tokens 2 and 3 of 6 prefills a chunk;
    one that feeds its last two (a decode over the whole prompt) does not."""
    prompt = [5, 6, 7, 8, 9, 10]
    assert _prefills(verify([7, 8], [2, 3], cache=2), 0, prompt)
    assert not _prefills(verify([9, 10], [4, 5], cache=4), 0, prompt)


def test_twin_draft_rows_are_read_by_index_in_a_batch_of_the_verify_s_size() -> None:
    """Two draft rows fed the same token at the same position proposed the same: in a draft batch
    of the verify's size each verify row's draft is its own index (not told apart otherwise)."""
    twins = make("draft", [[7], [7]], [[3], [3]], 3, argmax=[[9], [9]])
    both = make("target", [[7, 9], [7, 9]], [[3, 4], [3, 4]], 3)
    assert read_row([twins, both], 1, 1) == RowQuery(0, 1, ((0, 1),))


def test_draft_rows_alike_but_for_their_position_are_told_apart_by_it() -> None:
    """A draft batch of another size (3 rows) whose rows 0 and 2 were fed 7 and proposed 9, at
    positions 5 and 3: the verify row fed 7 at position 3 is row 2's."""
    drafts = make("draft", [[7], [4], [7]], [[5], [2], [3]], 3, argmax=[[9], [1], [9]])
    target = make("target", [[7, 9], [6, 2]], [[3, 4], [3, 4]], 3)
    assert read_row([drafts, target], 1, 0) == RowQuery(0, 1, ((0, 2),))


# ----------------------------------------------------------------------------- drafts proposed at once


def parallel_draft(ids: list[int], positions: list[int], argmax: list[int]) -> CallRecord:
    """A draft call of one row that proposes several drafts in one forward (PARD-style): fed the
    pending token, then placeholders (0), over a cache of `positions[0]` slots; `argmax` per slot."""
    return make("draft", [ids], [positions], positions[0], argmax=[argmax])


def test_drafts_one_call_proposed_at_once_are_the_rows_drafts() -> None:
    """The draft was fed 9 (pending) and two placeholders at 3, 4, 5 and chose 11, 12, 13 there: no
    run of calls proposed them one a call, yet the verify's 11, 12, 13 are that call's drafts."""
    calls = [parallel_draft([9, 0, 0], [3, 4, 5], [11, 12, 13]), verify([9, 11, 12, 13], [3, 4, 5, 6])]
    assert read_row(calls, 1, 0) == RowQuery(0, 3, ())


def test_drafts_proposed_at_once_after_a_catch_up_token() -> None:
    """The draft first catches up 7 (accepted last step, never in its cache), then is fed 9 and two
    placeholders: its proposals start at the slot fed the pending token."""
    calls = [parallel_draft([7, 9, 0, 0], [2, 3, 4, 5], [9, 11, 12, 13]), verify([9, 11, 12, 13], [3, 4, 5, 6])]
    assert read_row(calls, 1, 0) == RowQuery(0, 3, ())


def test_a_row_no_draft_call_proposed_at_once_has_no_drafts() -> None:
    """The draft chose 14 where the verify feeds 13, or was fed another pending token: the verify's
    tokens are not that call's proposals, so no drafts are read (its last slot is pending), as before."""
    other_choice = [parallel_draft([9, 0, 0], [3, 4, 5], [11, 12, 14]), verify([9, 11, 12, 13], [3, 4, 5, 6])]
    other_pending = [parallel_draft([8, 0, 0], [3, 4, 5], [11, 12, 13]), verify([9, 11, 12, 13], [3, 4, 5, 6])]
    assert read_row(other_choice, 1, 0) == RowQuery(3, 0, ())
    assert read_row(other_pending, 1, 0) == RowQuery(3, 0, ())
