"""A cell's details open only on a cell the grid draws: Enter on a row whose first flagged slot lies
left of the drawn window opens its first flagged slot in view (or its pending slot), and a panel
following the grid to a later step, whose window moved right, lands on the first drawn cell."""

from __future__ import annotations

import re

import pytest

from specviz.app import loading, share
from specviz.views.grid import DEFAULT_WINDOW, drawn_columns

WIDE = "default-eqspec-pad-accumulation.json.gz"  # step 1, row 0: first flagged slot 47, window 75..


def opened_col(panel: str) -> int:
    return int(re.search(r"data-col='(\d+)'", panel).group(1))


@pytest.fixture(scope="module")
def loaded():
    if WIDE not in loading.bundled_traces():
        pytest.skip(f"{WIDE} is not bundled (run tools/make_traces.py)")
    return loading.load_bundled(WIDE)


def test_enter_opens_a_drawn_cell(loaded) -> None:
    grid = loaded.step_slots(1)
    drawn = drawn_columns(grid, DEFAULT_WINDOW)
    row = grid.find_row(0)
    flagged = [s.col for s in row.slots if s.flagged]
    assert flagged and flagged[0] < drawn.start  # the case: the row's first flag is out of view
    col = opened_col(share.cell_details(loaded, 1, 0, None, DEFAULT_WINDOW))
    assert col in drawn
    in_view = [c for c in flagged if c in drawn]
    assert col == (in_view[0] if in_view else grid.cache_len)
    wide = drawn_columns(grid, 512)  # a window wide enough to draw it: the first flag itself
    assert flagged[0] in wide and opened_col(share.cell_details(loaded, 1, 0, None, 512)) == flagged[0]


def test_a_cell_left_of_the_window_opens_the_first_drawn_one(loaded) -> None:
    drawn = drawn_columns(loaded.step_slots(1), DEFAULT_WINDOW)
    assert opened_col(share.cell_details(loaded, 1, 0, 3, DEFAULT_WINDOW)) == drawn.start
    assert share.cell_details(loaded, 1, 0, 10**6, DEFAULT_WINDOW) == ""  # no such cell: nothing
