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


def test_live_tree_run_picked_in_the_form_opens_its_trees(page: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The live-run form's proposer and tree pickers reach the engine: a head tree run opens with
    its candidate trees under the grid (the tiny pair with a tiny head stands in for the models)."""
    from tiny import make_pair

    from specviz.app import live
    from specviz.engine.proposers import EagleHead

    pair = make_pair("llama")
    pair.head = EagleHead.for_target(pair.target, inner=32, seed=1)
    monkeypatch.setattr(live, "load_model_pair", lambda target, draft, with_draft: pair)
    page.set_viewport_size({"width": 1440, "height": 1000})
    page.get_by_text("Live run into slot A").click()
    form = page.locator(".block", has=page.get_by_text("Live run into slot A")).first
    form.get_by_label("proposer").click()
    page.get_by_role("option", name="EAGLE-style head on the target's hidden states").click()
    form.get_by_label("number input for tree: alternative drafts (0: a chain)").fill("2")
    form.get_by_label("number input for tree: alternative drafts (0: a chain)").press("Enter")
    form.get_by_label("number input for max new tokens").fill("8")
    form.get_by_label("number input for max new tokens").press("Enter")
    form.get_by_label("or your own prompts, one per line").fill("hello world\nthe quick brown fox\nab")  # char tokens
    page.get_by_role("button", name="Run live into A").click()
    page.locator("#sv-summary-a").get_by_text("live run").first.wait_for()
    settle(page)
    summary = page.locator("#sv-summary-a").inner_text()
    assert "CLEAN" in summary and "drafts by head, tree (2 alternatives)" in summary
    tree = page.locator("#sv-tree")
    tree.scroll_into_view_if_needed()
    assert tree.locator("path.point").count() >= 1 + 3 + 2  # at least one row's root, chain and alternatives
