"""How the watch reads one row's emitted tokens against its drafts and the target's choices
(`specviz.watch.tree`: `consistent`, `accepted_path`, over a chain read as a tree whose node i
hangs off node i - 1; `calls.matched_prefix`), by hand: drafts and target argmaxes are small
integers, every expected value worked out in the comment beside it. Greedy verification accepts the
drafts up to the first one the target disagrees with, then emits the target's own token there (the
bonus)."""

from __future__ import annotations

import pytest

from specviz.watch.calls import matched_prefix
from specviz.watch.tree import accepted_path, consistent

DRAFTS = [4, 5]
ALL_AGREE = [4, 5, 6]  # the target chose 4 and 5 too, then 6: accept both, bonus 6
SECOND_DIFFERS = [4, 7, 8]  # the target chose 7 after 4: accept one, bonus 7
PENDING = 3  # node 0 of the chain: the pending token


def chain(drafts: list[int]) -> tuple[list[int], list[int]]:
    """(parents, nodes) of a chain row: the pending token, then each draft after the one before."""
    return list(range(-1, len(drafts))), [PENDING, *drafts]


@pytest.mark.parametrize(
    ("tokens", "targets", "free_last", "expected"),
    [
        ([], ALL_AGREE, False, True),  # nothing emitted (yet)
        ([4, 5], ALL_AGREE, False, True),  # drafts only
        ([4, 5, 6], ALL_AGREE, False, True),  # drafts, then the target's token after them
        ([4, 7], SECOND_DIFFERS, False, True),  # one draft, then the target's token at slot 1
        ([4, 9], SECOND_DIFFERS, False, False),  # 9 is neither draft 5 nor the target's 7
        ([4, 9], SECOND_DIFFERS, True, True),  # ... unless the last token is free (sampled)
        ([9, 5], ALL_AGREE, True, False),  # a wrong token before the last: never consistent
        ([4, 5, 6, 1], ALL_AGREE, True, False),  # more than the drafts and one token
        ([4, 5, 6], [4, 5], False, False),  # no target token at slot 2 to compare with
        ([4, 5, 6], [4, 5], True, True),
    ],
)
def test_consistent(tokens: list[int], targets: list[int], free_last: bool, expected: bool) -> None:
    assert consistent(tokens, *chain(DRAFTS), targets, free_last) is expected


def test_matched_prefix() -> None:
    assert matched_prefix(DRAFTS, ALL_AGREE) == 2
    assert matched_prefix(DRAFTS, SECOND_DIFFERS) == 1
    assert matched_prefix(DRAFTS, [9, 5, 6]) == 0  # the first draft rejected: the later agreeing one does not count
    assert matched_prefix([], [3]) == 0
    assert matched_prefix(DRAFTS, [4, 5]) is None  # targets are not one per draft plus one: unknown
    assert matched_prefix(DRAFTS, [4, 5, 6, 7]) is None


@pytest.mark.parametrize(
    ("tokens", "drafts", "targets", "expected"),
    [
        ([4, 5, 6], DRAFTS, ALL_AGREE, (2, 6)),  # all accepted, the bonus after them
        ([4, 7], DRAFTS, SECOND_DIFFERS, (1, 7)),  # one accepted, the target's 7 in place of draft 5
        ([4], DRAFTS, ALL_AGREE, (2, None)),  # a prefix of what verification allowed (budget cut)
        ([], DRAFTS, ALL_AGREE, (2, None)),
        ([7], [], [7], (0, 7)),  # no drafts: the target's token is the bonus
        ([4, 5, 9], DRAFTS, SECOND_DIFFERS, (2, 9)),  # not the greedy answer: the drafts emitted, then 9
        ([4, 9], DRAFTS, [], (1, 9)),  # no target tokens: read off the drafts emitted
        ([9], DRAFTS, [], (0, 9)),
        ([4, 5], DRAFTS, [], (2, None)),
    ],
)
def test_accepted_and_bonus(
    tokens: list[int], drafts: list[int], targets: list[int], expected: tuple[int, int | None]
) -> None:
    path, bonus = accepted_path(tokens, *chain(drafts), targets)
    assert (len(path), bonus) == expected
    assert path == list(range(1, expected[0] + 1))  # a chain's accepted nodes: its first drafts
