"""The command's last steps, read but not seen (`header.options.watch_read_as_greedy`): counted
for the report, and a hostile value (an edited file) is left out in silence, never a traceback."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specviz.analysis.notes import read_as_greedy_note
from specviz.analysis.unread import READ_AS_GREEDY, read_as_greedy


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"0": 2, "3": 1}, (2, 3)),
        ({}, (0, 0)),
        (None, (0, 0)),
        ([1, 2], (0, 0)),
        ({"x": 2, "-1": 1, "2": 0, "4": True, "5": 2.5, "6": "2", "7": 4}, (1, 4)),
    ],
)
def test_counts_only_sequence_ids_with_positive_token_counts(value, expected) -> None:
    assert read_as_greedy({READ_AS_GREEDY: value}) == expected


def test_the_note_says_what_was_taken_on_trust_and_nothing_when_all_was_seen() -> None:
    def header(options: dict) -> SimpleNamespace:  # the note reads a header's options only
        return SimpleNamespace(options=options)

    note = read_as_greedy_note(header({READ_AS_GREEDY: {"0": 2, "3": 1}}))
    assert note is not None and note.startswith("the last step of 2 sequence(s) (3 token(s))")
    assert read_as_greedy_note(header({})) is None
    assert read_as_greedy_note(header({READ_AS_GREEDY: {"0": 0}})) is None
