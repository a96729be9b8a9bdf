"""The app in a real browser (headless Chromium via Playwright): a new user picks a faulty bundled
trace, sees the ragged grid, jumps to the first violation and finds the divergent token.
Screenshots land in test-output/ (gitignored) for a human to look at.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser import CHROMIUM, SHOTS, served_page, settle

import app
from specviz.app.loading import TRACES, bundled_traces

FAULTY = "default-eqspec-column-positions.json.gz"
FIRST_CELL = "path[style*='rgb(127, 29, 29)']"  # the first-violation outline (palette.FIRST_FLAG_COLOR)

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")


@pytest.fixture(scope="module")
def page() -> Any:
    if FAULTY not in bundled_traces():
        pytest.skip(f"{FAULTY} is not bundled (run tools/make_traces.py)")
    with served_page(app.build_app()) as tab:
        yield tab


def test_new_user_finds_where_desync_begins(page: Any) -> None:
    page.wait_for_selector("#sv-grid .js-plotly-plot")
    settle(page)
    page.screenshot(path=str(SHOTS / "01-opened.png"), full_page=True)

    # Pick a faulty bundled trace into slot A.
    page.get_by_label("bundled example trace").first.click()
    page.get_by_role("option", name=FAULTY).click()
    page.get_by_text("eqspec + fault column-positions").first.wait_for()
    page.wait_for_selector("#sv-grid .js-plotly-plot .heatmaplayer")
    assert "Desync begins at step" in page.locator(".sv-summary").first.inner_text()

    # Walk away from the violation, then jump back to it.
    page.get_by_role("button", name="next step ▶").click()
    page.wait_for_function("() => !document.querySelector(\"#sv-grid path[style*='rgb(127, 29, 29)']\")")
    page.get_by_role("button", name="jump to first violation").click()
    page.wait_for_selector(f"#sv-grid {FIRST_CELL}")
    settle(page)
    assert "desync" in " ".join(page.locator("#sv-grid .annotation-text").all_text_contents())
    assert page.locator("#sv-grid .gtitle").first.text_content().startswith("Step")
    page.locator("#sv-grid").screenshot(path=str(SHOTS / "02-first-violation-grid.png"))
    page.screenshot(path=str(SHOTS / "03-first-violation-page.png"), full_page=True)

    # The side-by-side outputs mark the first divergent token in red.
    page.get_by_role("tab", name="Outputs").click()
    divergent = page.locator("#sv-outputs [data-divergent='true']").first
    divergent.wait_for()
    color = divergent.evaluate("el => getComputedStyle(el).backgroundColor")
    assert color == "rgb(220, 38, 38)", color
    settle(page)
    page.screenshot(path=str(SHOTS / "04-outputs.png"), full_page=True)

    # The invariant timeline has its first violation starred.
    page.get_by_role("tab", name="Invariants").click()
    page.wait_for_selector("#sv-timeline .js-plotly-plot .scatterlayer")
    settle(page)
    assert "desync begins" in " ".join(page.locator("#sv-timeline .annotation-text").all_text_contents())
    page.screenshot(path=str(SHOTS / "05-invariants.png"), full_page=True)


# ----------------------------------------------------------------------------- issue 13: UI states

# The visible "Error" badges, each by its nearest element id, and the toasts shown: a test asserts
# no badges, and its failure message says where they are and why (a toast names the cause).
BADGES_JS = """() => ({
    badges: [...document.querySelectorAll('.error')]
        .filter((el) => el.offsetParent !== null && el.textContent.trim() === 'Error')
        .map((el) => { let p = el; while (p && !p.id) p = p.parentElement; return p ? p.id : null; }),
    toasts: [...document.querySelectorAll('.toast-body')].map((el) => el.innerText.slice(0, 200)),
})"""
FILL_JS = """(id) => {
    const box = document.querySelector(`#${id}`);
    const svg = box && box.querySelector('.main-svg');
    return svg ? svg.getBoundingClientRect().width / box.getBoundingClientRect().width : 0;
}"""
# Words of table headers split over two lines ("violatio ns"): a header may wrap between words only.
BROKEN_WORDS_JS = """() => [...document.querySelectorAll('th')]
  .filter((th) => th.offsetParent !== null).flatMap((th) => {
    const broken = [];
    const walker = document.createTreeWalker(th, NodeFilter.SHOW_TEXT);
    let node;
    while ((node = walker.nextNode())) {
        for (const match of node.textContent.matchAll(/\\S+/g)) {
            const range = document.createRange();
            range.setStart(node, match.index);
            range.setEnd(node, match.index + match[0].length);
            const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
            if (tops.size > 1) broken.push(match[0]);
        }
    }
    return broken;
})"""


def pick_bundled(page: Any, name: str, slot: int = 0) -> None:
    page.get_by_label("bundled example trace").nth(slot).click()
    page.get_by_role("option", name=name).click()
    settle(page)


def test_error_is_one_line_and_leaves_no_badge(page: Any, tmp_path: Path) -> None:
    page.set_viewport_size({"width": 1440, "height": 900})
    page.wait_for_selector("#sv-grid .js-plotly-plot", state="attached")  # the opening run is drawn
    settle(page)
    bad = tmp_path / "broken.json"
    bad.write_text('{"format": "specviz-trace", "header": 3}')
    page.locator("input[type=file]").first.set_input_files(str(bad))
    page.locator("#sv-status-a").get_by_text("broken.json").wait_for()
    settle(page)
    shown = page.evaluate(BADGES_JS)
    assert shown["badges"] == [], shown
    assert page.locator("#sv-grid .js-plotly-plot").count() == 1  # the run stays drawn
    pick_bundled(page, "default-eqspec-stale-kv.json.gz")
    page.locator("#sv-status-a").wait_for(state="hidden")
    shown = page.evaluate(BADGES_JS)
    assert shown["badges"] == [], shown


def test_upload_clears_the_bundled_name(page: Any, tmp_path: Path) -> None:
    good = tmp_path / "mine.json.gz"
    good.write_bytes((TRACES / "default-eqspec.json.gz").read_bytes())
    page.locator("input[type=file]").first.set_input_files(str(good))
    page.locator(".sv-summary").first.get_by_text("upload mine.json.gz").wait_for()
    assert page.get_by_label("bundled example trace").first.input_value() == ""
    assert not page.locator("#sv-download-a").is_visible()  # no live run yet: no empty file box
    assert "secondary" in page.locator("#sv-first").get_attribute("class")  # clean run: nothing to jump to


@pytest.mark.parametrize("tab,plot", [("Ragged grid", "sv-grid"), ("KV & positions", "sv-kv")])
def test_plot_updated_in_a_hidden_tab_fills_its_container(page: Any, tab: str, plot: str) -> None:
    page.get_by_role("tab", name="Outputs").click()
    pick_bundled(page, FAULTY if plot == "sv-grid" else "default-eqspec-stale-kv.json.gz")
    page.get_by_role("tab", name=tab).click()
    page.wait_for_function(f"(id) => ({FILL_JS})(id) >= 0.9", arg=plot)  # fails by timeout if it never fills
    settle(page)
    assert page.evaluate(FILL_JS, plot) >= 0.9
    if plot == "sv-grid":  # the legend sits under the rows, never on them
        legend = page.locator("#sv-grid-legend").bounding_box()
        rows = page.locator("#sv-grid .nsewdrag").first.bounding_box()
        assert legend["y"] >= rows["y"] + rows["height"] - 1
    page.screenshot(path=str(SHOTS / f"10-hidden-then-{plot}.png"))


@pytest.mark.parametrize("width", [1440, 1024])
def test_table_headers_do_not_wrap(page: Any, width: int) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    for tab in ("Invariants", "Acceptance"):
        page.get_by_role("tab", name=tab).click()
        settle(page)
        assert page.evaluate(BROKEN_WORDS_JS) == [], f"{tab} at {width}px"
    page.set_viewport_size({"width": 1440, "height": 900})


def test_timeline_markers_open_their_steps(page: Any) -> None:
    """Any marker, the last one too (it sits half a step from the plot's right edge): the middle
    marker, then the last, of one pick of the faulty run (was one test and one pick for each)."""
    pick_bundled(page, FAULTY)
    for which in ("middle", "last"):
        page.get_by_role("tab", name="Invariants").click()
        page.wait_for_selector("#sv-timeline .scatterlayer .point")
        settle(page)
        points = page.locator("#sv-timeline .scatterlayer .trace").first.locator(".point")
        index = points.count() // 2 if which == "middle" else points.count() - 1
        target = points.nth(index)
        step = page.evaluate("(i) => document.querySelector('#sv-timeline .js-plotly-plot').data[0].x[i]", index)
        assert page.locator("#sv-step input[type=number]").input_value() != str(step), which  # a move to see
        target.scroll_into_view_if_needed()
        box = target.bounding_box()  # plotly's drag layer takes the pointer: click where the marker is drawn
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        # plotly knows the point under the pointer: its label names this marker's step (not a label
        # left from the marker before). The pointer arrives as a hand does, over a few moves: a
        # single jump onto the last marker, right after the tab redrew its plot, was sometimes
        # not taken as a hover at all (no label, with or without the marker's own).
        label = page.locator("#sv-timeline .hoverlayer .hovertext", has_text=f"step {step} ")
        for attempt in range(3):
            page.mouse.move(x - 12, y)
            page.mouse.move(x, y, steps=4)
            try:
                label.wait_for(timeout=5_000 if attempt < 2 else 60_000)
                break
            except Exception:  # noqa: BLE001 - a missed hover: move in again (the last try raises)
                if attempt == 2:
                    raise
        page.mouse.click(x, y)
        page.wait_for_function(
            "(step) => document.querySelector('#sv-step input[type=number]').value == String(step)", arg=step
        )
        assert page.get_by_role("tab", name="Ragged grid").get_attribute("aria-selected") == "true", which


def test_violation_click_opens_a_fitted_grid(page: Any) -> None:
    page.get_by_role("tab", name="Invariants").click()
    # Gradio draws the table's lines virtually: find a cell by its text, among the visible ones.
    page.locator("#sv-violations").get_by_text("position-contiguity").locator("visible=true").nth(2).click()
    page.wait_for_function(
        "() => document.querySelector('button[role=tab][aria-selected=true]').textContent.includes('grid')"
    )
    settle(page)
    assert page.evaluate(FILL_JS, "sv-grid") >= 0.9
    legend = page.locator("#sv-grid-legend").bounding_box()
    rows = page.locator("#sv-grid .nsewdrag").first.bounding_box()
    assert legend["y"] >= rows["y"] + rows["height"] - 1  # the legend never covers the rows


# ----------------------------------------------------------------------------- issue 25: three widths

WIDTHS = [(1440, 900), (1024, 768), (390, 844)]
# A word split over two lines in a table cell, the grid's legend or a slot's summary (a compound
# may break after its hyphen, "column-|positions", as text does; never inside a part).
SPLIT_WORDS_JS = """() => {
  const broken = [];
  document.querySelectorAll('th, td, #sv-grid-legend, .sv-summary').forEach((box) => {
    if (box.offsetParent === null) return;
    const walker = document.createTreeWalker(box, NodeFilter.SHOW_TEXT);
    let node;
    while ((node = walker.nextNode())) {
      for (const match of node.textContent.matchAll(/[^\\s-]+/g)) {
        const range = document.createRange();
        range.setStart(node, match.index);
        range.setEnd(node, match.index + match[0].length);
        if (new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size > 1) broken.push(match[0]);
      }
    }
  });
  return broken;
}"""
# A block whose content is wider than it (tables scroll inside their own wrapper: not counted).
TOO_WIDE_JS = """() => [...document.querySelectorAll('.block, table')]
  .filter((b) => b.offsetParent !== null && !b.closest('.table-wrap') && !b.querySelector('.js-plotly-plot'))
  .filter((b) => {
    if (b.tagName !== 'TABLE') return b.scrollWidth > b.clientWidth + 2;
    const table = b.getBoundingClientRect(), panel = b.parentElement.closest('.block').getBoundingClientRect();
    return table.right > panel.right + 1 || table.left < panel.left - 1;
  })
  .map((b) => `${(b.closest('[id]') || {}).id}:${b.tagName}:${Math.round(b.getBoundingClientRect().width)}`)"""
GRID_BOXES_JS = """() => {
  const box = (s) => { const r = document.querySelector(s).getBoundingClientRect();
                       return { x: r.x, y: r.y + window.scrollY, width: r.width, height: r.height }; };
  const title = document.querySelector('#sv-grid .gtitle').getBoundingClientRect();
  const svg = document.querySelector('#sv-grid .main-svg').getBoundingClientRect();
  return { plot: box('#sv-grid .main-svg'), cells: box('#sv-grid .nsewdrag'), title_right: title.right,
           plot_right: svg.right };
}"""
STATUS_BADGES_JS = """() => [...document.querySelectorAll('.wrap .error, .block .error')]
    .filter((el) => el.offsetParent !== null && el.textContent.trim() === 'Error')
    .map((el) => (el.closest('[id]') || {}).id || '?')"""


def fitted(page: Any, width: int) -> None:
    """Wait until the page script has fitted the grid to this width (assets.GRID_FIT_JS)."""
    mode = ":narrow" if width < 700 else ":wide"
    page.wait_for_function(
        "(mode) => { const gd = document.querySelector('#sv-grid .js-plotly-plot');"
        " return gd && (gd.__svFit || '').endsWith(mode); }",
        arg=mode,
    )
    settle(page)


@pytest.fixture(scope="module")
def layouts(page: Any) -> dict[tuple[int, int], dict[str, Any]]:
    """What each width's test reads, measured with one pick of the faulty run (was one pick per
    width): the page at 1440 px, the grid's tab, then the width, as each test did after its pick."""
    page.set_viewport_size({"width": 1440, "height": 900})
    pick_bundled(page, FAULTY)
    seen: dict[tuple[int, int], dict[str, Any]] = {}
    try:
        for width, height in WIDTHS:
            page.set_viewport_size({"width": 1440, "height": 900})
            page.get_by_role("tab", name="Ragged grid").click()
            page.set_viewport_size({"width": width, "height": height})
            page.evaluate("() => window.scrollTo(0, 0)")
            fitted(page, width)
            seen[(width, height)] = {
                "boxes": page.evaluate(GRID_BOXES_JS),
                "split": page.evaluate(SPLIT_WORDS_JS),
                "too_wide": page.evaluate(TOO_WIDE_JS),
                "scroll_width": page.evaluate("() => document.documentElement.scrollWidth"),
                "legend": page.locator("#sv-grid-legend").inner_text(),
            }
            page.screenshot(path=str(SHOTS / f"25-layout-{width}.png"))
    finally:
        page.set_viewport_size({"width": 1440, "height": 900})
    return seen


@pytest.mark.parametrize("width,height", WIDTHS)
def test_layout_holds_at_every_width(layouts: dict, width: int, height: int) -> None:
    seen = layouts[(width, height)]
    boxes = seen["boxes"]
    plot, cells = boxes["plot"], boxes["cells"]
    assert seen["split"] == [], f"words split at {width}px"
    assert seen["too_wide"] == [], f"wider than its panel at {width}px"
    assert seen["scroll_width"] <= width
    assert boxes["title_right"] <= boxes["plot_right"] + 1  # the step title is not cut
    legend = seen["legend"]
    assert "fed ≠ expected" in legend and "desync begins here" in legend
    if width < 700:  # a phone: the cells get most of the plot
        assert cells["width"] >= 0.6 * plot["width"], (cells, plot)
        assert cells["height"] >= 0.6 * plot["height"], (cells, plot)
    if (width, height) == (1440, 900):  # the first screen shows the grid's rows, not only the verdict
        assert cells["y"] + 3 * 30 <= height, cells  # its first three rows at least


@pytest.mark.parametrize("width", [1024, 390])
def test_tables_keep_their_words_in_every_tab(page: Any, width: int) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    try:
        for tab in ("Invariants", "Acceptance", "A vs B"):
            button = page.get_by_role("tab", name=tab)
            if not button.is_visible():  # a phone: Gradio folds the last tabs into its overflow menu
                continue
            button.click()
            page.locator("button[role=tab][aria-selected=true]", has_text=tab).wait_for()
            settle(page)
            assert page.evaluate(SPLIT_WORDS_JS) == [], f"{tab} at {width}px"
    finally:
        page.set_viewport_size({"width": 1440, "height": 900})
        page.get_by_role("tab", name="Ragged grid").click()


def test_refused_live_run_leaves_no_error_badge(page: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from specviz.app import live
    from specviz.errors import SpecvizError

    release = threading.Event()

    def held_pair(target: str, draft: str, with_draft: bool) -> Any:
        release.wait(60)
        raise SpecvizError("stopped by the test")

    monkeypatch.setattr(live, "load_model_pair", held_pair)
    page.set_viewport_size({"width": 1440, "height": 900})
    try:
        page.get_by_text("Live run into slot A").click()
        page.get_by_role("button", name="Run live into A").click()
        page.locator("#sv-summary-a .progress-text, #sv-summary-a .eta-bar").first.wait_for()
        page.get_by_text("Live run into slot B").click()
        page.get_by_role("button", name="Run live into B").click()
        page.locator("#sv-status-b").get_by_text("live run not started").wait_for()
        assert page.evaluate(STATUS_BADGES_JS) == []
    finally:
        release.set()
    page.locator("#sv-status-a").get_by_text("stopped by the test").wait_for()
    page.get_by_role("button", name="next step ▶").click()
    settle(page)
    assert page.evaluate(STATUS_BADGES_JS) == []
    # A success in slot B clears slot A's error line too: it was not about B's run.
    pick_bundled(page, "default-eqspec.json.gz", slot=1)
    page.locator("#sv-status-a").wait_for(state="hidden")
    page.locator("#sv-status-b").wait_for(state="hidden")
