"""What the row follower keeps while it walks an engine's target calls
(`specviz/watch/infer/match.py`): a sequence's open step as its row was fed (`Step`: the drafts
a greedy engine keeps, the token it commits after them, which tokens could end the step), a
sequence as first followed (`Seq`), and the row markers. Every value is worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest

# The code under test, in one block.
from specviz.watch.calls import RowQuery
from specviz.watch.infer.match import IDLE, NEW, RowView, Seq, Step


def test_the_row_markers_are_no_sequence_and_differ() -> None:
    """A row is read as a sequence id (>= 0), a new sequence or an idle finished one: three things."""
    assert NEW < 0 and IDLE < 0 and NEW != IDLE


# ----------------------------------------------------------------------------- Step


def test_a_greedy_step_keeps_the_drafts_the_target_agrees_with_then_its_choice() -> None:
    """Pending token fed, drafts [5, 6, 7], the target's argmax at the pending token and each draft
    [5, 6, 9, 4]: drafts 5 and 6 agree, 7 does not (the target chose 9 there): 2 kept, then 9."""
    step = Step(drafts=[5, 6, 7], targets=[5, 6, 9, 4], pending=3, most=4)
    assert step.agreed == 2
    assert step.choice == 9
    assert step.greedy == [5, 6, 9]


def test_every_draft_agreed_takes_the_bonus() -> None:
    step = Step(drafts=[5, 6], targets=[5, 6, 8], pending=3, most=3)
    assert (step.agreed, step.choice, step.greedy) == (2, 8, [5, 6, 8])


def test_the_first_draft_refused() -> None:
    step = Step(drafts=[5, 6], targets=[1, 6, 8], pending=3, most=3)  # draft 6 agrees, but after a refusal
    assert (step.agreed, step.choice, step.greedy) == (0, 1, [1])


def test_a_step_without_drafts_commits_the_targets_choice() -> None:
    step = Step(drafts=[], targets=[7], pending=3, most=1)
    assert (step.agreed, step.choice, step.greedy) == (0, 7, [7])


def test_a_step_without_an_argmax_kept_agrees_nothing_and_chooses_nothing() -> None:
    step = Step(drafts=[5, 6], targets=[], pending=3, most=3)
    assert (step.agreed, step.choice, step.greedy) == (0, None, [])


def test_could_end_with_an_argmax_kept() -> None:
    """Drafts [5, 6], targets [5, 9, 8]: after taking 0 drafts the step ends on the target's 5 (or
    the draft 5: the same token); after 1, on the target's 9 or (no bonus) the draft 6; after 2 on
    the bonus 8. It cannot take -1 or 3 drafts, nor end on a token neither the target nor the
    draft there is."""
    step = Step(drafts=[5, 6], targets=[5, 9, 8], pending=3, most=3)
    assert step.could_end(0, 5)
    assert step.could_end(1, 9) and step.could_end(1, 6)
    assert not step.could_end(1, 5) and not step.could_end(1, 8)
    assert step.could_end(2, 8)
    assert not step.could_end(2, 6) and not step.could_end(2, 9)  # no draft at 2
    assert not step.could_end(0, 9) and not step.could_end(0, 6)
    assert not step.could_end(3, 8) and not step.could_end(-1, 5)


def test_could_end_without_an_argmax_kept_is_any_token_of_any_count_that_fits() -> None:
    step = Step(drafts=[5, 6], targets=[], pending=3, most=3)
    assert step.could_end(0, 42) and step.could_end(1, 42) and step.could_end(2, 42)
    assert not step.could_end(3, 42) and not step.could_end(-1, 42)


def test_a_step_is_a_value() -> None:
    step = Step(drafts=[1], targets=[1, 2], pending=0, most=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.pending = 1  # type: ignore[misc]


# ----------------------------------------------------------------------------- Seq and RowView


def test_a_sequence_first_followed_is_open_and_nothing_else() -> None:
    seq = Seq(id=0, context=[1, 2], prompt_len=2, origin=(0, 0), at=(0, 0), step=(0, 0))
    assert seq.opened and not seq.in_prompt and not seq.refed and not seq.finished
    assert seq.growth == "open"  # its first call's reading is still open
    seq.opened = False
    assert seq.growth == "grow"


def test_a_row_view_is_shared_and_never_edited() -> None:
    """The follower caches one view per (call, row, sequence) and hands it to every check."""
    view = RowView(
        rq=RowQuery(pending=2, drafts=0, chain=()), token=7, context=4, query=[5, 6, 7], whole=False, position=4
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.token = 8  # type: ignore[misc]
