"""Where links, keys and uploads land, in a real browser, on an app opened with `--trace PATH`:
a link into either slot opens its exact step and row (or says why not), a link naming another
`--trace` file says so, `?` and Enter show what they open, Enter and h / l stay in the drawn
cells, and a file that is no trace gets the app's one line, not Gradio's red toast.

One page session walks every path, so the file costs one server and one browser.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser import CHROMIUM, served_page, settle

import app
from specviz.app import loading

MINE = "default-eqspec-column-positions.json.gz"  # stands for the user's own file, opened with --trace
IN_B = "default-eqspec-stale-kv.json.gz"
# A row whose first flagged slot (47) lies left of the drawn window (slots 75..114) at step 1.
WIDE = "default-eqspec-pad-accumulation.json.gz"

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")

WHERE_JS = "() => { const w = document.querySelector('#sv-grid-legend .sv-where'); return w && {...w.dataset}; }"
# How far an element's box lies inside the window (1: whole, 0: none of it).
IN_VIEW_JS = """(sel) => {
    const el = document.querySelector(sel);
    if (!el) return -1;
    const r = el.getBoundingClientRect();
    const seen = Math.min(r.bottom, window.innerHeight) - Math.max(r.top, 0);
    return r.height > 0 ? Math.max(0, seen) / Math.min(r.height, window.innerHeight) : 0;
}"""
GRID_META_JS = "() => document.querySelector('#sv-grid .js-plotly-plot').layout.meta.sv_grid"


@pytest.fixture(scope="module")
def page() -> Any:
    for name in (MINE, IN_B, WIDE):
        if name not in loading.bundled_traces():
            pytest.skip(f"{name} is not bundled (run tools/make_traces.py)")
    loading.open_local_a(loading.TRACES / MINE)
    try:
        with served_page(app.build_app()) as tab:
            tab.set_viewport_size({"width": 1440, "height": 900})
            tab.wait_for_selector("#sv-grid .js-plotly-plot")
            settle(tab)
            yield tab
    finally:
        loading.LOCAL_A.clear()


def where(page: Any) -> dict[str, str]:
    return page.evaluate(WHERE_JS)


def open_link(page: Any, query: str) -> None:
    page.goto(page.url.split("?")[0] + "?" + query)
    page.wait_for_selector("#sv-grid .js-plotly-plot")
    settle(page)
    page.wait_for_timeout(1000)  # any later redraw (an inspect switch's own event) has been queued by now
    settle(page)


def cells_of(name: str, step: int) -> list[int]:
    return [r.row for r in loading.load_bundled(name).step_slots(step).rows]


@pytest.mark.parametrize("slot", ["A", "B"])
def test_a_link_lands_on_its_exact_step_and_row(page: Any, slot: str) -> None:
    loaded = loading.load_bundled(IN_B)
    first = loaded.report.first_violation
    # Steps and rows away from the run's first violation (where a slot opens by itself).
    for step in (3, 5, loaded.step_count - 2):
        row = cells_of(IN_B, step)[-1]
        assert (step, row) != (first.step_index, first.row)
        open_link(page, f"slot={slot}&trace={IN_B}&step={step}&row={row}")
        assert where(page) == {"trace": IN_B, "step": str(step), "row": str(row)}
        assert page.locator("#sv-inspect input:checked").get_attribute("value") == slot
        assert f"step={step}" in page.url and f"row={row}" in page.url  # the address bar still says it
        assert not page.locator(f"#sv-status-{slot.lower()}").is_visible()  # nothing to say: it is there


def test_a_link_past_the_run_says_where_it_opened(page: Any) -> None:
    loaded = loading.load_bundled(IN_B)
    last = loaded.step_count - 1
    open_link(page, f"slot=B&trace={IN_B}&step={last + 50}&row=999")
    assert where(page)["step"] == str(last)
    status = page.locator("#sv-status-b").inner_text()
    assert f"step {last + 50}" in status and f"last step is {last}" in status and "row 999" in status
    assert page.locator("#sv-bundled-b input").input_value() == IN_B  # the run itself did open: named


def test_a_link_to_another_trace_file_says_so(page: Any) -> None:
    open_link(page, "slot=A&trace=--trace&run=yesterday.json.gz&step=2&row=1")
    status = page.locator("#sv-status-a").inner_text()
    assert "yesterday.json.gz" in status and MINE in status
    # The link this app copies names its own file: opened here, it says nothing.
    link = page.evaluate("() => window.svLink()")
    assert f"run={MINE}" in link
    page.goto(link)
    page.wait_for_selector("#sv-grid .js-plotly-plot")
    settle(page)
    assert not page.locator("#sv-status-a").is_visible()


def test_keys_show_what_they_open_and_stay_in_the_drawn_cells(page: Any) -> None:
    row = 0
    open_link(page, f"slot=B&trace={WIDE}&step=1&row={row}")
    page.evaluate("() => window.scrollTo(0, 0)")
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    page.keyboard.press("?")
    page.locator("#sv-keys-help").get_by_text("next / previous step").wait_for()
    page.wait_for_function(f"() => ({IN_VIEW_JS})('#sv-keys-help') > 0.9")
    page.keyboard.press("Escape")
    page.evaluate("() => window.scrollTo(0, 0)")
    page.keyboard.press("Enter")
    panel = page.locator("#sv-details .sv-cell")
    panel.wait_for()
    page.wait_for_function(f"() => ({IN_VIEW_JS})('#sv-details .sv-cell') > 0.9")
    drawn = [c for c in page.evaluate(GRID_META_JS)["cols"] if c is not None]
    assert int(panel.get_attribute("data-row")) == row
    assert int(panel.get_attribute("data-col")) in drawn  # never a cell the grid does not show
    # h walks left through the drawn cells to the first one and stops there; l walks back.
    index = drawn.index(int(panel.get_attribute("data-col")))
    for want in reversed(drawn[:index]):
        page.keyboard.press("h")
        wait_col(page, want)
    page.keyboard.press("h")
    page.wait_for_timeout(1000)
    settle(page)
    assert int(panel.get_attribute("data-col")) == drawn[0]
    page.keyboard.press("l")
    wait_col(page, drawn[1])


def wait_col(page: Any, col: int) -> None:
    page.wait_for_function(f"() => document.querySelector('#sv-details .sv-cell')?.dataset.col === '{col}'")


def test_a_file_that_is_no_trace_gets_the_apps_line(page: Any, tmp_path: Path) -> None:
    open_link(page, "slot=A")
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "specviz-trace", "header": 3}')
    page.locator("input[type=file]").nth(1).set_input_files(str(broken))
    page.locator("#sv-status-b").get_by_text("broken.json").wait_for()
    picture = tmp_path / "screenshot.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    page.locator("input[type=file]").nth(1).set_input_files(str(picture))
    page.locator("#sv-status-b").get_by_text("screenshot.png").wait_for()
    settle(page)
    status = page.locator("#sv-status-b").inner_text()
    assert "broken.json" not in status  # the older failure is gone: this line is about this file
    assert "PNG image" in status and ".json" in status
    # No red "Error" toast from Gradio: the app's own warning says the same line.
    toasts = page.locator(".toast-body").all_inner_texts()
    assert not any(t.strip().startswith("Error") for t in toasts), toasts
