"""The command's reading of the first call after a prefill that gave no token (`infer.gains.Gains._chunk`):
a chunk of the prompt, or the pending token and its drafts, told apart by the next call's row. Here
where both readings give the row the token it is fed, the position fed to it decides: at the step's
place a step, elsewhere (after the whole query, or where neither reading puts it: a position bug
either way) the mask, which kept the whole query. Every value is worked out by hand.

The open step: the sequence's context [5, 6, 7, 5] (known = 4, its last token the pending one),
drafts [6, 8]; the next row attends 6 slots (the whole query kept). A step that took no draft puts
its token at position 4, a chunk's next token sits at 6."""

from __future__ import annotations

import pytest

# The code under test, in one block.
from specviz.watch.calls import RowQuery
from specviz.watch.infer.gains import Gains
from specviz.watch.infer.match import RowView, Step

KNOWN = 4


def _row(token: int, position: int, context: int = 6) -> RowView:
    rq = RowQuery(pending=0, drafts=0, chain=())
    return RowView(rq=rq, token=token, context=context, query=[token], whole=False, position=position)


# Short of the prompt's end: the target chose 5 at the pending token (its greedy pick, no draft
# agreed), and the next chunk starts with 5 too.
SHORT = Step(drafts=[6, 8], targets=[5, 91, 71], pending=5, most=3)


@pytest.mark.parametrize(
    ("position", "chunk"),
    [
        (4, False),  # the step's place: a step that took no draft
        (6, True),  # after the whole query: a chunk
        (0, True),  # neither reading's (a chunk numbered from 0): the mask kept the whole query
        (9, True),
        (-1, False),  # no position fed: the step reading stands
    ],
)
def test_a_chunk_short_of_the_end_fed_the_greedy_pick_is_told_by_the_position(position: int, chunk: bool) -> None:
    assert Gains._chunk(SHORT, _row(5, position), KNOWN) is chunk


def test_a_chunk_short_of_the_end_fed_no_choice_of_the_target_is_a_chunk_wherever_it_sits() -> None:
    assert all(Gains._chunk(SHORT, _row(13, p), KNOWN) for p in (-1, 0, 4, 6))


def test_a_query_not_kept_whole_is_no_chunk() -> None:
    """The row attends 5 slots: the context grew by one draft, not both."""
    assert not any(Gains._chunk(SHORT, _row(5, p, context=5), KNOWN) for p in (-1, 0, 4, 5, 6))


# The last chunk: the target's choice after the whole query (9) is also its choice at the pending
# token, where no draft agreed: both readings give 9.
LAST = Step(drafts=[6, 8], targets=[9, 1, 9], pending=5, most=3)


@pytest.mark.parametrize(
    ("position", "chunk"),
    [
        (4, False),  # the step's place
        (6, True),  # after the whole query
        (0, True),  # neither reading's: the mask tells
        (-1, True),  # none fed: the reading that explains the growth without a bug
    ],
)
def test_a_last_chunk_whose_token_is_also_the_greedy_pick_is_told_by_the_position(position: int, chunk: bool) -> None:
    assert Gains._chunk(LAST, _row(9, position), KNOWN) is chunk


def test_a_last_chunk_fed_the_choice_after_the_whole_query_and_no_greedy_pick_is_a_chunk() -> None:
    step = Step(drafts=[6, 8], targets=[9, 1, 7], pending=5, most=3)
    assert all(Gains._chunk(step, _row(7, p), KNOWN) for p in (-1, 0, 4, 6))


def test_a_query_the_target_picked_whole_is_a_step() -> None:
    """Every draft agreed (targets 6, 8, then 7): a greedy step keeps the whole query too."""
    step = Step(drafts=[6, 8], targets=[6, 8, 7], pending=5, most=3)
    assert not any(Gains._chunk(step, _row(7, p), KNOWN) for p in (-1, 0, 4, 6))
