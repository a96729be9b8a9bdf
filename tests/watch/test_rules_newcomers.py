"""How the command's row follower reads newcomers (`specviz/watch/infer/match.py`, issue 41 item 2),
on hand-built target and draft calls (2-D masks, positions fed), every expectation by hand:

- newcomers of one call with prompts of one length are told apart by the token each chose there
  (`_opening_agrees`), where every row without a tie is fed its own choice; a row fed neither
  newcomer's choice stays a tie (unreadable), never a guess;
- a newcomer prefilled over KV another request left is read from its first token on (`Seq.base`):
  its next row continues it, not the old request;
- a one-token row that continues no sequence is a newcomer when the draft's next call re-reads it
  from the start, then the target's choice (`_draft_opens`)."""

from __future__ import annotations

from watch_calls import tokens_of

# The code under test, in one block.
from specviz.watch.autowatch import infer
from specviz.watch.record import CallRecord


def call(ids: list[list[int]], width: int, argmax: list[list[int]], role: str = "target") -> CallRecord:
    """Rows of one length over `width` cached slots, every slot attended, positions from `width` on."""
    q = len(ids[0])
    return CallRecord(
        role=role, rows=None, input_ids=ids, positions=[list(range(width, width + q))] * len(ids),
        positions_fed=True, cache_width=width, mask_kind="2d", mask=[[1] * (width + q) for _ in ids],
        batch_size=len(ids), query_len=q, argmax=argmax,
    )  # fmt: skip


def test_equal_length_newcomers_are_told_apart_by_the_token_each_chose() -> None:
    """A = [5, 6, 7] (its choice 40) and B = [8, 9, 10] (its choice 50) are prefilled together; B
    ends there, and the next call holds one row fed 40 over 3 slots: both chains fit it (a context
    of 3, either's first step), the token only A's. Read as A, B left with its choice."""
    calls = [call([[5, 6, 7], [8, 9, 10]], 0, [[1, 2, 40], [3, 4, 50]]), call([[40]], 3, [[41]])]
    notes: list[str] = []
    prompts, emits = infer(calls, frozenset(), notes)
    assert not notes, notes
    assert prompts == [[5, 6, 7], [8, 9, 10]] and calls[1].rows == (0,)
    assert tokens_of(emits) == {0: [40, 41], 1: [50]}


def test_equal_length_newcomers_fed_neither_choice_stay_a_tie() -> None:
    """The same, the row fed 77: the prefill was of all but the last prompt token, whose token
    either newcomer's could be. Two readings: reading stops there, unreadable with its reason."""
    calls = [call([[5, 6, 7], [8, 9, 10]], 0, [[1, 2, 40], [3, 4, 50]]), call([[77]], 3, [[41]])]
    notes: list[str] = []
    infer(calls, frozenset(), notes)
    assert len(notes) == 1 and "fit more than one sequence" in notes[0], notes


def test_a_newcomer_over_stale_kv_is_read_from_its_first_token() -> None:
    """A = [5, 6, 7] gains 40 then 60 (its last step, no later call shows it). Its slot is given to
    N = [20, 21], written after A's 4 slots (a length not reset): a cached row fed two tokens, no
    drafts, that fits no chain, so a new sequence. Its next row, fed its choice 60 over 6 slots, is
    N's first step seen from N's first token (4 stale slots before it), not A's greedy 60. (A draft
    model ran, re-reading A's context: without one, a cached row's first slot is its pending token.)"""
    calls = [
        call([[5, 6, 7]], 0, [[1, 2, 40]]),
        call([[5, 6, 7, 40]], 0, [[0, 0, 0, 77]], role="draft"),
        call([[40]], 3, [[60]]),
        call([[20, 21]], 4, [[9, 60]]),  # N over A's 4 slots
        call([[60]], 6, [[61]]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, frozenset(), notes)
    assert not notes, notes
    assert prompts == [[5, 6, 7], [20, 21]]
    assert [c.rows for c in calls if c.role == "target"] == [(0,), (0,), (1,), (1,)]
    assert tokens_of(emits) == {0: [40, 60], 1: [60, 61]}


def test_a_one_token_newcomer_the_draft_re_reads_from_the_start_is_new() -> None:
    """A = [5, 6, 7] gains 40, then its slot holds [9] after A's 4 slots, its choice 28: a row fed
    one token, which continues no chain (A's step chose 41). The draft's next call re-reads [9, 28]
    from the start (no cache) and proposes 30: a sequence that begins with 9, its first step 28,
    then verified [28, 30]. Read as a new sequence, not as A fed a wrong token. (Its last step read
    as greedy, [30, 31], is cut to the one budget both greedy ends fit: 2 tokens.)"""
    calls = [
        call([[5, 6, 7]], 0, [[1, 2, 40]]),
        call([[40]], 3, [[41]]),
        call([[9]], 4, [[28]]),  # one token over A's 4 slots
        call([[9, 28]], 0, [[0, 30]], role="draft"),
        call([[28, 30]], 5, [[30, 31]]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, frozenset(), notes)
    assert not notes, notes
    assert prompts == [[5, 6, 7], [9]]
    assert calls[2].rows == (1,) and calls[4].rows == (1,)
    assert tokens_of(emits) == {0: [40, 41], 1: [28, 30]}


def test_a_one_token_row_the_draft_does_not_re_read_continues_as_before() -> None:
    """The same row fed 9 with no draft call after it: nothing shows a new sequence, so the row is
    read as A's next step (its wrong token flagged there by the checks), as before."""
    calls = [call([[5, 6, 7]], 0, [[1, 2, 40]]), call([[40]], 3, [[41]]), call([[9]], 4, [[28]])]
    notes: list[str] = []
    prompts, _ = infer(calls, frozenset(), notes)
    assert prompts == [[5, 6, 7]] and calls[2].rows == (0,)


def test_a_prompt_over_stale_kv_whose_count_reaches_an_opened_sequence_is_new() -> None:
    """A = [4, 79] and B = [45, 11, 30, 35, 7, 41] are prefilled (A left-padded) and both end there.
    N = [23, 71, 88, 94, 56] is then written after A's 2 slots: its last token attends 6 slots, B's
    length, as B's first step would. But the 4 tokens it feeds before it are not B's last 4: N is a
    new sequence (its stale context flagged at its first step), not B."""
    first = CallRecord(
        role="target", rows=None, input_ids=[[0, 0, 0, 0, 4, 79], [45, 11, 30, 35, 7, 41]],
        positions=[[0, 0, 0, 0, 0, 1], [0, 1, 2, 3, 4, 5]], positions_fed=True, cache_width=0, mask_kind="2d",
        mask=[[0, 0, 0, 0, 1, 1], [1] * 6], batch_size=2, query_len=6, argmax=[[0] * 5 + [78], [0] * 5 + [57]],
    )  # fmt: skip
    draft = call([[4, 79, 78]], 0, [[0, 0, 5]], role="draft")  # a draft model ran (a cacheless one)
    newcomer = CallRecord(
        role="target", rows=None, input_ids=[[23, 71, 88, 94, 56], [0] * 5],
        positions=[[2, 3, 4, 5, 6], [6] * 5], positions_fed=True, cache_width=6, mask_kind="2d",
        mask=[[0, 0, 0, 0, 1, 1] + [1] * 5, [1] * 6 + [0] * 5], batch_size=2, query_len=5,
        argmax=[[0, 0, 0, 0, 33], [0] * 5],
    )  # fmt: skip
    notes: list[str] = []
    prompts, _ = infer([first, draft, newcomer], frozenset(), notes)
    assert not notes, notes
    assert prompts == [[4, 79], [45, 11, 30, 35, 7, 41], [23, 71, 88, 94, 56]]
    assert newcomer.rows[0] == 2


def test_a_one_token_newcomer_the_draft_re_reads_is_not_the_sequence_its_count_fits() -> None:
    """A = [5, 6, 7] (its choice 40) and B = [44] (left-padded, its choice 28) are prefilled; B ends
    there. Its slot then holds N = [33] after B's one slot: a context of 1, as B's first step would
    show. The draft's next call re-reads [33, 95] (N, then the target's choice there) from the
    start: N begins a sequence, so it is not B (read as B, B's prefill would have been of all but
    its last token, and so A's too)."""
    first = CallRecord(
        role="target", rows=None, input_ids=[[5, 6, 7], [0, 0, 44]], positions=[[0, 1, 2], [0, 0, 0]],
        positions_fed=True, cache_width=0, mask_kind="2d", mask=[[1, 1, 1], [0, 0, 1]], batch_size=2,
        query_len=3, argmax=[[0, 0, 40], [0, 0, 28]],
    )  # fmt: skip
    proposes = call([[5, 6, 7, 40]], 0, [[0, 0, 0, 41]], role="draft")  # a cacheless draft: 41 after 40
    step = CallRecord(
        role="target", rows=None, input_ids=[[40, 41], [33, 0]], positions=[[3, 4], [1, 2]], positions_fed=True,
        cache_width=3, mask_kind="2d", mask=[[1, 1, 1, 1, 1], [0, 0, 1, 1, 0]], batch_size=2, query_len=2,
        argmax=[[41, 50], [95, 0]],
    )  # fmt: skip
    reread = CallRecord(
        role="draft", rows=None, input_ids=[[0, 0], [33, 95]], positions=[[0, 0], [0, 1]], positions_fed=True,
        cache_width=0, mask_kind="2d", mask=[[0, 0], [1, 1]], batch_size=2, query_len=2, argmax=[[0, 0], [0, 7]],
    )  # fmt: skip
    notes: list[str] = []
    prompts, _ = infer([first, proposes, step, reread], frozenset(), notes)
    assert not notes, notes
    assert prompts == [[5, 6, 7], [44], [33]]
    assert step.rows == (0, 2)


def test_a_draft_that_feeds_the_row_and_its_choice_over_its_own_cache_does_not_re_read_it() -> None:
    """The same row fed 9, then a draft call fed [9, 28] over its own cache of 4 slots: the draft
    continues the context it holds (it catches up with what the target was fed and chose), it does
    not re-read [9] from the start. Nothing shows a new sequence: the row is A's next step."""
    calls = [
        call([[5, 6, 7]], 0, [[1, 2, 40]]),
        call([[40]], 3, [[41]]),
        call([[9]], 4, [[28]]),
        call([[9, 28]], 4, [[0, 30]], role="draft"),  # over the draft's cache: no re-read
    ]
    notes: list[str] = []
    prompts, _ = infer(calls, frozenset(), notes)
    assert prompts == [[5, 6, 7]] and calls[2].rows == (0,)


def test_newcomers_whose_first_call_verified_drafts_are_not_told_apart_by_the_last_slots_choice() -> None:
    """A = [5, 6, 7] and B = [8, 9, 10] are verified with one draft each in their first call (a
    cacheless draft model proposed 20 and 30): A refuses 20 (the target chose 40 at 7), B accepts 30
    and gains the bonus 40 (the argmax at its last slot). The next call holds one row fed 40 over 3
    slots: A's step (40 after its prompt's 3 slots), not B's, whose 40 would follow 30, over 4
    slots. Both first steps could show a row over 3 or 4 slots, so the count does not tell them
    apart; the argmax at the first call's last slot says nothing of a step that verified drafts
    (it is the choice after every draft, which only a step that took them all commits). The row is
    read as A, or left unread with its reason: never as B."""
    calls = [
        call([[5, 6, 7], [8, 9, 10]], 0, [[1, 2, 20], [3, 4, 30]], role="draft"),
        call([[5, 6, 7, 20], [8, 9, 10, 30]], 0, [[1, 2, 40, 99], [3, 4, 30, 40]]),
        call([[40]], 3, [[41]]),
    ]
    notes: list[str] = []
    prompts, emits = infer(calls, frozenset(), notes)
    assert prompts[:2] == [[5, 6, 7], [8, 9, 10]]
    if notes:  # unread: the tie, with its reason
        assert len(notes) == 1 and "fit more than one sequence" in notes[0], notes
    else:
        assert calls[2].rows == (0,) and tokens_of(emits)[0] == [40, 41]
    assert calls[2].rows != (1,) and tokens_of(emits).get(1) != [30, 40, 41]
