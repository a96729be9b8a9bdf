"""What the row follower reads a step gave (`specviz/watch/infer/gains.py`), on target calls
written by hand: a prompt prefilled in chunks told from steps by the position fed, the endings
read from a run's last steps. Every expected prompt and token is worked out in the docstrings."""

from __future__ import annotations

from watch_calls import target_call as call
from watch_calls import tokens_of

# The code under test, in one block.
from specviz.watch.autowatch import infer
from specviz.watch.hooks import CallRecord

EOS = frozenset([1])


def read(calls: list[CallRecord]) -> tuple[list[list[int]], dict[int, list[int]], list[str]]:
    notes: list[str] = []
    prompts, emits = infer(calls, EOS, notes)
    tokens = tokens_of(emits)
    return prompts, tokens, notes


def chunked(c1_argmax: list[int], ids: list[int], position: int, argmax: list[int]) -> tuple:
    """No draft model, one sequence: [5, 6] prefilled without a cache (its argmax 98 never fed
    next), then [7, 8] with `c1_argmax`, then `ids` fed at `position` after four slots (7 and 8
    both attended: the context grew by the whole query). Returns prompts, tokens, notes and what
    the map of the call of [7, 8] says of its drafts (0: its prompt's last chunk, as `w.batch(drafts=0)`
    would say, for the steps read from it; None: not said)."""
    calls = [
        call([[5, 6]], 0, [[1, 1]], [0], [[99, 98]]),
        call([[7, 8]], 2, [[1] * 4], [2], [c1_argmax]),
        call([ids], 4, [[1] * (4 + len(ids))], [position], [argmax]),
    ]
    return (*read(calls), calls[1].map.segments[0].drafts)


def test_a_last_chunk_and_a_step_that_give_one_token_are_told_by_the_position_fed() -> None:
    """[7, 8] under argmax [40, 40]: 40 is both the greedy pick after 7 (8 refused) and the
    target's choice after the whole query. Fed at position 4, after all four tokens: [7, 8] was the
    prompt's last chunk (its map says so), the prompt is [5, 6, 7, 8] and 40 its first token. Fed at position 3, after
    three: a step that took no draft and committed 40, whose rejected slot stays attended (a KV
    bug for the check): the prompt is [5, 6, 7]. Either way the last step's argmax 50 follows."""
    assert chunked([40, 40], [40], 4, [50]) == ([[5, 6, 7, 8]], {0: [40, 50]}, [], 0)
    assert chunked([40, 40], [40], 3, [50]) == ([[5, 6, 7]], {0: [40, 50]}, [], None)


def test_a_chunk_short_of_the_prompts_end_is_told_from_a_step_by_the_position_fed() -> None:
    """[7, 8] under argmax [9, 50], then [9, 10]: 9 is the greedy pick after 7 (8 refused) and
    the next chunk may start with it too. Fed at position 3: a step that committed 9 (its rejected
    slot left attended), then 10 its draft, refused for 60: the prompt is [5, 6, 7], the output 9,
    60. Fed at position 4, after the whole query: [7, 8] was a chunk and [9, 10] the next (its 9
    pending, 10 read as its draft, refused for 60): the prompt is [5, 6, 7, 8, 9]."""
    assert chunked([9, 50], [9, 10], 3, [60, 61]) == ([[5, 6, 7]], {0: [9, 60]}, [], None)
    assert chunked([9, 50], [9, 10], 4, [60, 61]) == ([[5, 6, 7, 8, 9]], {0: [60]}, [], None)


def test_a_step_without_an_argmax_kept_gained_what_its_context_grew_by() -> None:
    """No draft model and no argmax kept (nothing says what the target chose). A = [5, 6, 7] is
    prefilled (a step: its first token 40 is fed next), then fed 40 with the drafts 41, 42; the next
    call feeds 43 after five slots ([5, 6, 7, 40, 41]: 42's slot masked). The context grew by two:
    one draft taken, then 43. So the step gained 41, 43 (not 41, 42, 43: a draft more than the
    context shows), and the last step, with no argmax, adds nothing."""
    prompts, tokens, notes = read(
        [
            call([[5, 6, 7]], 0, [[1, 1, 1]], [0], None),
            call([[40, 41, 42]], 3, [[1] * 6], [3], None),
            call([[43, 44, 45]], 6, [[1, 1, 1, 1, 1, 0, 1, 1, 1]], [5], None),
        ]
    )
    assert not notes, notes
    assert prompts == [[5, 6, 7]]
    assert tokens == {0: [40, 41, 43]}


def test_a_row_read_by_its_token_took_the_drafts_before_the_slot_that_chose_it() -> None:
    """No draft model. A = [5, 6, 7] is prefilled (its 40 fed next), then fed 40 with the drafts 20,
    21 under argmax [20, 25, 30] (a greedy engine keeps 20, then 25). The next call feeds 30, the
    target's choice after both drafts (an engine that accepted 21 against the target), over a mask
    that lost two of A's six slots (a cache bug): no chain fits, and 30 is read by its token as
    what the slot after both drafts chose: the step gained 20, 21, 30 (the check then judges it),
    and the last step's argmax ends A with EOS."""
    prompts, tokens, notes = read(
        [
            call([[5, 6, 7]], 0, [[1, 1, 1]], [0], [[99, 99, 40]]),
            call([[40, 20, 21]], 3, [[1] * 6], [3], [[20, 25, 30]]),
            call([[30, 31, 32]], 6, [[1, 1, 0, 0, 1, 1, 1, 1, 1]], [6], [[1, 99, 99]]),
        ]
    )
    assert not notes, notes
    assert prompts == [[5, 6, 7]]
    assert tokens == {0: [40, 20, 21, 30, 1]}


def test_a_cacheless_draft_re_reads_what_the_step_committed_whatever_the_targets_context() -> None:
    """A draft model without a cache (fed each sequence's whole context) beside a cached target.
    A = [5, 6, 7] is prefilled (40 fed next); the draft, fed [5, 6, 7, 40], proposes 20; the target
    verifies [40, 20] under argmax [25, 25] (a greedy engine keeps no draft, then 25), yet the
    draft is next fed [5, 6, 7, 40, 20, 25]: the engine committed 20, 25 (a bug). The target's next
    row attends four slots (20's slot lost), which alone would read as 25 only. The draft's re-read
    says what was committed: 20, 25, then the last step's EOS; the checks judge it from there."""
    from specviz.watch.hooks import CallRecord

    def draft(ids: list[int], argmax: list[int]) -> CallRecord:
        q = len(ids)
        return CallRecord(
            role="draft", rows=None, input_ids=[ids], positions=[list(range(q))], positions_fed=True,
            cache_width=0, mask_kind="2d", mask=[[1] * q], batch_size=1, query_len=q, argmax=[argmax],
        )  # fmt: skip

    prompts, tokens, notes = read(
        [
            call([[5, 6, 7]], 0, [[1, 1, 1]], [0], [[99, 99, 40]]),
            draft([5, 6, 7, 40], [99, 99, 99, 20]),
            call([[40, 20]], 3, [[1] * 5], [3], [[25, 25]]),
            draft([5, 6, 7, 40, 20, 25], [99, 99, 99, 99, 99, 30]),
            call([[25, 30]], 5, [[1, 1, 1, 1, 0, 1, 1]], [5], [[1, 99]]),
        ]
    )
    assert not notes, notes
    assert prompts == [[5, 6, 7]]
    assert tokens == {0: [40, 20, 25, 1]}


def test_a_view_fed_no_position_reads_as_the_chunk_whatever_its_context() -> None:
    """`_chunk` by hand: a prompt's open chunk [7, 8] (7 pending, 8 read like a draft) under argmax
    [40, 40], three tokens known, the next row fed 40 after four slots. 40 is both the greedy pick
    and the choice after the whole chunk: the position fed tells (4: after the whole chunk, a chunk;
    3: after what a step committed, not one), and with none fed the chunk reading stands, which
    explains the context's growth without a bug. A `RowView` whose engine fed no position (-1) reads
    as the chunk, whatever its context."""
    from specviz.watch.calls import RowQuery
    from specviz.watch.infer.gains import Gains
    from specviz.watch.infer.match import RowView, Step

    step = Step(drafts=[8], targets=[40, 40], pending=7, most=2)
    rq = RowQuery(0, 0, ())
    for context in (2, 4, 5):  # (2 and 5 do not fit a chunk of one draft after three tokens)
        unfed = RowView(rq, token=40, context=context, query=[40], whole=False, position=-1)
        assert Gains._chunk(step, unfed, 3) is (context == 4)
    assert Gains._chunk(step, RowView(rq, 40, 4, [40], False, position=4), 3)
    assert not Gains._chunk(step, RowView(rq, 40, 4, [40], False, position=3), 3)


def test_a_greedy_end_past_the_budget_another_sequence_stopped_at_is_cut_to_it() -> None:
    """No draft model. A = [5, 6, 7] and B = [8, 9, 10], prefilled but their last token, step
    together: A 40, 50, 60; B 41, 51, then B's row is fed 51 with the draft 70 under argmax [70, 80]
    and leaves the batch (its last step, read as greedy: 70, 80). A is then fed 60, and 60 again
    (its cache not grown past it): A stopped at three tokens, the run's budget. B read two tokens
    before its last step, so that step was cut at the budget too: B ends 41, 51, 70 (not 80)."""
    prompts, tokens, notes = read(
        [
            call([[5, 6], [8, 9]], 0, [[1, 1], [1, 1]], [0, 0], [[99, 98], [99, 98]]),  # 98: never fed next
            call([[7], [10]], 2, [[1] * 3, [1] * 3], [2, 2], [[40], [41]]),
            call([[40], [41]], 3, [[1] * 4, [1] * 4], [3, 3], [[50], [51]]),
            call([[50, 0], [51, 70]], 4, [[1, 1, 1, 1, 1, 0], [1] * 6], [4, 4], [[60, 0], [70, 80]]),
            call([[60]], 6, [[1, 1, 1, 1, 1, 0, 1]], [5], [[70]]),
            call([[60]], 7, [[1, 1, 1, 1, 1, 0, 1, 1]], [5], [[70]]),
        ]
    )
    assert not notes, notes
    assert prompts == [[5, 6, 7], [8, 9, 10]]
    assert tokens == {0: [40, 50, 60], 1: [41, 51, 70]}


def test_last_steps_read_as_greedy_are_cut_to_the_shortest_greedy_end() -> None:
    """The same two sequences, the run ending after the call that feeds B its draft: both last
    steps are read as greedy, A's 60 (three tokens) and B's 70, 80 (four). One budget fits both
    endings, the shortest, three: A ends there and B's step is cut to it, 41, 51, 70."""
    prompts, tokens, notes = read(
        [
            call([[5, 6], [8, 9]], 0, [[1, 1], [1, 1]], [0, 0], [[99, 98], [99, 98]]),  # 98: never fed next
            call([[7], [10]], 2, [[1] * 3, [1] * 3], [2, 2], [[40], [41]]),
            call([[40], [41]], 3, [[1] * 4, [1] * 4], [3, 3], [[50], [51]]),
            call([[50, 0], [51, 70]], 4, [[1, 1, 1, 1, 1, 0], [1] * 6], [4, 4], [[60, 0], [70, 80]]),
        ]
    )
    assert not notes, notes
    assert prompts == [[5, 6, 7], [8, 9, 10]]
    assert tokens == {0: [40, 50, 60], 1: [41, 51, 70]}


def _cacheless(role: str, ids: list[int], argmax: list[int]) -> CallRecord:
    """One row re-fed its whole context (no cache), by the target or a draft model."""
    q = len(ids)
    return CallRecord(
        role=role, rows=None, input_ids=[ids], positions=[list(range(q))], positions_fed=True, cache_width=0,
        mask_kind="2d", mask=[[1] * q], batch_size=1, query_len=q, argmax=[argmax],
    )  # fmt: skip


def _drafted(second: int, third: int) -> list[CallRecord]:
    """A = [5, 6, 7] is prefilled (40 fed next); a cacheless draft model then proposes three drafts,
    each call re-fed the context and the drafts so far: its argmax is 11 after 40, 13 after the
    second token, 15 after the third. The second and third tokens fed are `second` and `third`
    (11 and 13 where it feeds its own choices), then the target verifies 40 and the three drafts."""
    return [
        call([[5, 6, 7]], 0, [[1, 1, 1]], [0], [[99, 99, 40]]),
        _cacheless("draft", [5, 6, 7, 40], [99, 99, 99, 11]),
        _cacheless("draft", [5, 6, 7, 40, second], [99] * 4 + [13]),
        _cacheless("draft", [5, 6, 7, 40, second, third], [99] * 5 + [15]),
        call([[40, second, third, 15]], 3, [[1] * 7], [3], [[second, third, 15, 16]]),
    ]


def test_a_draft_model_fed_tokens_it_did_not_choose_twice_is_read_as_sampling() -> None:
    """Draft rows extended by a token that is not the draft's argmax, twice (12 where it chose 11,
    14 where it chose 13): the engine samples, and greedy acceptance does not follow its rows.
    Reading stops there with that reason. A draft that feeds its own choices (11, 13) is read as
    greedy, and once only (12, then its own 13) is not yet a sampler: no note either way."""
    _, _, notes = read(_drafted(12, 14))
    assert len(notes) == 1 and "2 of 2 draft tokens fed are not the draft's argmax: the engine samples" in notes[0]
    for second, third in ((11, 13), (12, 13)):
        _, _, notes = read(_drafted(second, third))
        assert not notes, (second, third, notes)


def test_a_chunk_is_not_read_where_the_fed_position_is_the_steps_after_a_kept_draft() -> None:
    """`_chunk` by hand: the open query [7, 8, 9] (7 pending) under argmax [8, 40, 41] after three
    known tokens: a greedy step keeps the draft 8 and commits 40, which sits at position 4 (3 + 1
    kept). The next row is fed 40 after five slots (9's slot left attended: a KV bug for the
    check), at position 4: the step's place, so a step, not a chunk (a chunk's next token would
    follow the whole query, the choice 41 at position 5)."""
    from specviz.watch.calls import RowQuery
    from specviz.watch.infer.gains import Gains
    from specviz.watch.infer.match import RowView, Step

    step = Step(drafts=[8, 9], targets=[8, 40, 41], pending=7, most=3)
    rq = RowQuery(0, 0, ())
    assert not Gains._chunk(step, RowView(rq, 40, 5, [40], False, position=4), 3)
    assert Gains._chunk(step, RowView(rq, 41, 5, [41], False, position=5), 3)


def test_a_row_fed_a_draft_no_slot_chose_took_the_drafts_up_to_it() -> None:
    """As above, A = [5, 6, 7] fed 40 with the drafts 20, 21 under argmax [20, 25, 30]; the next call
    feeds 21 (the last draft taken, fed again: no bonus kept) over a mask that lost two slots, so
    no chain fits and 21, which no slot chose, is read by its token: the drafts up to it. The step
    gained 20, 21, then the last step's argmax ends A with EOS."""
    prompts, tokens, notes = read(
        [
            call([[5, 6, 7]], 0, [[1, 1, 1]], [0], [[99, 99, 40]]),
            call([[40, 20, 21]], 3, [[1] * 6], [3], [[20, 25, 30]]),
            call([[21, 31, 32]], 6, [[1, 1, 0, 0, 1, 1, 1, 1, 1]], [6], [[1, 99, 99]]),
        ]
    )
    assert not notes, notes
    assert prompts == [[5, 6, 7]]
    assert tokens == {0: [40, 20, 21, 1]}


def _refed_run() -> list[CallRecord]:
    """No cache, no draft model: A = [5, 6, 7] and B = [8, 9, 10] re-fed whole each call; A gains 40,
    50, 60, B 41, 51, then B's row holds its draft 70 under argmax [70, 80] and B leaves; A's
    context with 60 is then re-fed unchanged."""
    return [
        call([[5, 6, 7], [8, 9, 10]], 0, [[1] * 3] * 2, [0, 0], [[99, 99, 40], [99, 99, 41]]),
        call([[5, 6, 7, 40], [8, 9, 10, 41]], 0, [[1] * 4] * 2, [0, 0], [[99] * 3 + [50], [99] * 3 + [51]]),
        call(
            [[0, 5, 6, 7, 40, 50], [8, 9, 10, 41, 51, 70]],
            0,
            [[0, 1, 1, 1, 1, 1], [1] * 6],
            [0, 0],
            [[0] + [99] * 4 + [60], [99] * 4 + [70, 80]],
        ),
        call([[5, 6, 7, 40, 50, 60]], 0, [[1] * 6], [0], [[99] * 5 + [70]]),
        call([[5, 6, 7, 40, 50, 60]], 0, [[1] * 6], [0], [[99] * 5 + [70]]),  # re-fed unchanged
    ]


def test_a_sequence_re_fed_unchanged_stopped_there_and_cuts_a_greedy_end_past_it() -> None:
    """No cache, no draft model: A = [5, 6, 7] and B = [8, 9, 10] re-fed whole each call. A gains 40,
    50, 60; B 41, 51, then B's row holds its draft 70 under argmax [70, 80] and B leaves (its last
    step, read as greedy: 70, 80). A's context with 60 is then re-fed unchanged: A stopped at three
    tokens, the run's budget, so B's last step is cut to it: 41, 51, 70 (not 80)."""
    prompts, tokens, notes = read(_refed_run())
    assert not notes, notes
    assert prompts == [[5, 6, 7], [8, 9, 10]]
    assert tokens == {0: [40, 50, 60], 1: [41, 51, 70]}


def test_a_sequence_that_committed_eos_has_finished_and_gains_nothing_more() -> None:
    """A = [5, 6, 7] and B = [8, 9, 10], prefilled but their last token, step together: A's first
    step chooses EOS (1), and its row is fed 1 (its step committed it: A ends there, by "eos"),
    while B gains 41, 51; the last call holds B alone (61). A, finished at its EOS, gets no last
    step read as greedy after it: A is [1], B 41, 51, 61."""
    prompts, tokens, notes = read(
        [
            call([[5, 6], [8, 9]], 0, [[1, 1], [1, 1]], [0, 0], [[99, 98], [99, 98]]),  # 98: never fed next
            call([[7], [10]], 2, [[1] * 3, [1] * 3], [2, 2], [[1], [41]]),
            call([[1], [41]], 3, [[1] * 4, [1] * 4], [3, 3], [[1], [51]]),
            call([[51]], 4, [[1] * 5], [4], [[61]]),
        ]
    )
    assert not notes, notes
    assert prompts == [[5, 6, 7], [8, 9, 10]]
    assert tokens == {0: [1], 1: [41, 51, 61]}


def test_once_reading_stops_the_last_steps_read_are_not_cut_to_a_budget() -> None:
    """The run of the re-fed test above, then a call of two cached rows fed 77 and 78, which continue
    no sequence read so far: reading stops there (a note). The last steps read are then not the
    sequences' endings, so B's greedy last step (70, 80) is not cut to A's three tokens."""
    prompts, tokens, notes = read(
        [*_refed_run(), call([[77], [78]], 6, [[1] * 7] * 2, [6, 6], [[79], [79]])]  # no sequence read so far
    )
    assert len(notes) == 1 and "continues no sequence read so far" in notes[0], notes
    assert prompts == [[5, 6, 7], [8, 9, 10]]
    assert tokens == {0: [40, 50, 60], 1: [41, 51, 70, 80]}


def test_a_last_chunk_in_a_call_whose_map_is_unreadable_leaves_the_map_as_it_was() -> None:
    """The first chunked run above ([7, 8] the prompt's last chunk, 40 fed at position 4), the call of
    [7, 8] declaring two sequences for its one unpacked row: its map is unreadable, with no segment
    to say `drafts=0` in. The chunk is still read as the prompt's last (prompt [5, 6, 7, 8], then
    40, 50), and the map stays unreadable, with no segment written into it."""
    calls = [
        call([[5, 6]], 0, [[1, 1]], [0], [[99, 98]]),
        call([[7, 8]], 2, [[1] * 4], [2], [[40, 40]]),
        call([[40]], 4, [[1] * 5], [4], [[50]]),
    ]
    calls[1].rows = (0, 3)  # two sequences declared for one row that packs none
    prompts, tokens, notes = read(calls)
    assert not notes, notes
    assert prompts == [[5, 6, 7, 8]] and tokens == {0: [40, 50]}
    assert calls[1].map.segments == () and calls[1].map.unreadable


def test_a_newcomer_whose_next_row_lost_one_cache_slot_still_gains_its_tokens() -> None:
    """A row over a cache that lost one slot of its sequence's context (a KV hole, for the KV check
    to flag) still gains the token it is fed: its context grew by 0, which a row that re-feeds its
    context reads as nothing gained, but a row over a cache shows only its query (mutant #145)."""
    calls = [
        call([[5, 6, 7]], 0, [[1, 1, 1]], [0], [[99, 99, 40]]),  # a step: 40 fed next
        call([[40]], 3, [[1, 0, 1, 1]], [3], [[50]]),  # at position 3, slot 1 lost: 2 slots before it
        call([[50]], 4, [[1, 0, 1, 1, 1]], [4], [[60]]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, frozenset([1]), notes)
    assert prompts == [[5, 6, 7]] and not notes
    assert tokens_of(emits) == {0: [40, 50, 60]}


def test_a_newcomer_never_continued_gains_nothing_where_its_opening_call_was_no_step() -> None:
    """A = [5, 6] (left-padded) and B = [8, 9, 11] are prefilled together in call 0 (argmax 98 and
    97 at their last slots). Only A is held again: fed 7, not 98, so call 0 was a prefill of all but
    the last prompt token, no step, for its newcomers. A then gains 40, 50, 60. B is never fed again:
    its prefill gave no token, so it gains none (not the 97 its last slot chose)."""
    prompts, tokens, notes = read(
        [
            call([[0, 5, 6], [8, 9, 11]], 0, [[0, 1, 1], [1, 1, 1]], [0, 0], [[99, 99, 98], [99, 99, 97]]),
            call([[7]], 3, [[0, 1, 1, 1]], [2], [[40]]),
            call([[40]], 4, [[0, 1, 1, 1, 1]], [3], [[50]]),
            call([[50]], 5, [[0, 1, 1, 1, 1, 1]], [4], [[60]]),
        ]
    )
    assert not notes, notes
    assert prompts == [[5, 6, 7], [8, 9, 11]]
    assert tokens == {0: [40, 50, 60]}


def padded(rows: list[list[int]], argmax: list[list[int]]) -> CallRecord:
    """A cacheless target call of `rows`, each re-fed whole and left-padded, `argmax` right-aligned."""
    width = max(len(r) for r in rows)
    pads = [width - len(r) for r in rows]
    return call(
        [[0] * p + r for p, r in zip(pads, rows)],
        0,
        [[0] * p + [1] * len(r) for p, r in zip(pads, rows)],
        [0] * len(rows),
        [[0] * (width - len(a)) + a for a in argmax],
    )


def _repeats_past_a_stop(b_tail: list[list[int]], b_argmax: list[list[int]]) -> list[CallRecord]:
    """No cache, no draft model, rows left-padded: A = [5, 6, 7] gains 40, 50, 60 and is then re-fed
    unchanged (it stopped at three tokens, the run's budget); B = [8, 9, 10] gains 41, 51, 51, then
    is fed `b_tail` (after its prompt) beside A's unchanged row, then alone, under `b_argmax`."""
    a, b = [5, 6, 7], [8, 9, 10]
    return [
        padded([a, b], [[99, 99, 40], [99, 99, 41]]),
        padded([a + [40], b + [41]], [[99] * 3 + [50], [99] * 3 + [51]]),
        padded([a + [40, 50], b + [41, 51]], [[99] * 4 + [60], [99] * 4 + [51]]),
        padded([a + [40, 50, 60], b + [41, 51, 51]], [[99] * 5 + [70], [99] * 5 + [51]]),
        padded([a + [40, 50, 60], b + b_tail[0]], [[99] * 5 + [70], b_argmax[0]]),
        padded([b + b_tail[1]], [b_argmax[1]]),
    ]


def test_a_row_fed_along_one_token_a_call_past_a_stopped_sequences_budget_is_cut_to_it() -> None:
    """B, past A's three tokens, repeats its third (51) one token a call: a finished row fed along
    (the engine's budget is one for the run); B is cut to three tokens, 41, 51, 51."""
    tail = [[41, 51, 51, 51], [41, 51, 51, 51, 51]]
    prompts, tokens, notes = read(_repeats_past_a_stop(tail, [[99] * 6 + [51], [99] * 7 + [51]]))
    assert not notes, notes
    assert prompts == [[5, 6, 7], [8, 9, 10]]
    assert tokens == {0: [40, 50, 60], 1: [41, 51, 51]}


def test_a_row_that_gains_two_tokens_at_a_call_past_the_budget_was_decoding_and_is_not_cut() -> None:
    """As above, but B's row past the budget holds the draft 51 under argmax [51, 51]: it gains two
    tokens at that call (a draft accepted, then the bonus), so it was decoding under a budget of its
    own, not fed along: nothing is cut, B keeps 41 then six 51s."""
    tail = [[41, 51, 51, 51, 51], [41, 51, 51, 51, 51, 51]]
    prompts, tokens, notes = read(_repeats_past_a_stop(tail, [[99] * 6 + [51, 51], [99] * 8 + [51]]))
    assert not notes, notes
    assert prompts == [[5, 6, 7], [8, 9, 10]]
    assert tokens == {0: [40, 50, 60], 1: [41, 51, 51, 51, 51, 51, 51]}


def test_a_cacheless_row_fed_along_after_its_eos_is_idle_as_the_batch_shrinks() -> None:
    """No cache, no draft model: A = [5, 6, 7], B = [8, 9, 10, 3] and C = [11, 12] are re-fed whole.
    C chooses EOS (1) at once and is fed along with it; B leaves after 41, 51, so the batch shrinks
    while C's row re-feeds [11, 12, 1] unchanged. That row is C's, idle (a finished row fed along),
    not a new sequence whose prompt is C's context (as it read before 2026-12-08: a fourth prompt
    [11, 12, 1] gaining 77)."""
    a, b, c = [5, 6, 7], [8, 9, 10, 3], [11, 12]
    prompts, tokens, notes = read(
        [
            padded([a, b, c], [[99, 99, 40], [99, 99, 99, 41], [99, 1]]),
            padded([a + [40], b + [41], c + [1]], [[99] * 3 + [50], [99] * 4 + [51], [99, 99, 77]]),
            padded([a + [40, 50], c + [1]], [[99] * 4 + [60], [99, 99, 77]]),
            padded([a + [40, 50, 60], c + [1]], [[99] * 5 + [70], [99, 99, 77]]),
        ]
    )
    assert not notes, notes
    assert prompts == [a, b, c]
    assert tokens == {0: [40, 50, 60, 70], 1: [41, 51], 2: [1]}
