"""A tree run in a real browser: the candidate trees open under the grid, fit the page at phone
(390 px) and desktop (1440 px) widths, and mark the first broken node dark red (headless Chromium).
"""

from __future__ import annotations

from typing import Any

import pytest
from browser import CHROMIUM, SHOTS, served_page, settle

import app
from specviz.app.loading import bundled_traces

TREE_FAULT = "default-eqspec-tree-sibling-mask.json.gz"
BROKEN_NODE = "path.point[style*='rgb(127, 29, 29)']"  # views.tree.BROKEN, as plotly styles a marker

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")


@pytest.fixture(scope="module")
def page() -> Any:
    if TREE_FAULT not in bundled_traces():
        pytest.skip(f"{TREE_FAULT} is not bundled (run tools/make_traces.py)")
    with served_page(app.build_app()) as tab:
        yield tab


@pytest.mark.parametrize("width", [1440, 390])
def test_tree_step_fits_the_page_and_marks_its_first_broken_node(page: Any, width: int) -> None:
    page.set_viewport_size({"width": width, "height": 1000})
    page.get_by_label("bundled example trace").first.click()
    page.get_by_role("option", name=TREE_FAULT).click()
    settle(page)
    tree = page.locator("#sv-tree")
    tree.scroll_into_view_if_needed()
    settle(page)
    box = tree.locator(".main-svg").first.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width + 1, box
    assert tree.locator(BROKEN_NODE).count() >= 1
    SHOTS.mkdir(exist_ok=True)
    tree.screenshot(path=str(SHOTS / f"tree-{width}.png"))
    page.set_viewport_size({"width": 1400, "height": 1000})
