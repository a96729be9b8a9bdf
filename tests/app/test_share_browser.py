"""Issue 36 in a real browser, on an app opened with `--trace PATH` (as `python app.py --trace`
does): the user's run is never dropped by focus, the picker names it, slot B says it is an example.

One page session walks every path, so the file costs one server and one browser.
"""

from __future__ import annotations

from typing import Any

import pytest
from browser import CHROMIUM, SHOTS, served_page, settle

import app
from specviz.app import loading

MINE = "default-eqspec-column-positions.json.gz"  # stands for the user's own file, opened with --trace
FIRST_CELL = "path[style*='rgb(127, 29, 29)']"  # the first-violation cell (palette.FIRST_FLAG_COLOR)

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")


@pytest.fixture(scope="module")
def page() -> Any:
    if MINE not in loading.bundled_traces():
        pytest.skip(f"{MINE} is not bundled (run tools/make_traces.py)")
    loading.open_local_a(loading.TRACES / MINE)
    try:
        with served_page(app.build_app()) as tab:
            tab.wait_for_selector("#sv-grid .js-plotly-plot")
            settle(tab)
            yield tab
    finally:
        loading.LOCAL_A.clear()


def inspected(page: Any) -> str:
    return page.locator("#sv-inspect input:checked").get_attribute("value")


def test_focus_never_drops_the_users_run(page: Any) -> None:
    summary_a = page.locator("#sv-summary-a")
    assert "fault column-positions" in summary_a.inner_text()
    # Tab past A's picker, then B's, nothing picked: A keeps the run, the tabs keep inspecting A.
    page.locator("#sv-bundled-a input").focus()
    page.keyboard.press("Tab")
    page.locator("#sv-bundled-b input").focus()
    page.keyboard.press("Tab")
    page.wait_for_timeout(1500)  # a reload would be queued by now
    settle(page)
    assert "fault column-positions" in summary_a.inner_text()
    assert inspected(page) == "A"
    assert MINE in page.locator("#sv-bundled-a input").input_value()  # the picker names the run shown
    assert "bundled example" in page.locator("#sv-summary-b").inner_text()  # B is not the user's run
    # A pick made from the keyboard still loads: type to filter B's picker, Enter takes the entry.
    page.locator("#sv-bundled-b input").focus()
    page.keyboard.press("Control+a")  # the picker shows its entry: replace it with the filter
    page.keyboard.type("stale-kv")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    page.locator("#sv-summary-b h3", has_text="fault stale-kv").wait_for()
    assert inspected(page) == "B" and "fault column-positions" in summary_a.inner_text()
    page.locator("#sv-inspect input[value=A]").check()  # back to the user's run for the next test
    wait_where(page, trace="--trace")


WHERE_JS = "() => { const w = document.querySelector('#sv-grid-legend .sv-where'); return w && {...w.dataset}; }"


def where(page: Any) -> dict[str, str]:
    return page.evaluate(WHERE_JS)


def wait_where(page: Any, **expected: str) -> None:
    """Wait until the grid shows what `expected` says (its legend's data: trace, step, row)."""
    page.wait_for_function(
        f"(want) => {{ const w = ({WHERE_JS})(); return w && Object.entries(want).every(([k, v]) => w[k] === v); }}",
        arg=expected,
    )


def shot(page: Any, name: str, top: str, bottom: str) -> None:
    """A screenshot of the page from element `top` to element `bottom` (test-output/, for the docs)."""
    a = page.locator(top).first.bounding_box()
    b = page.locator(bottom).first.bounding_box()
    scroll = page.evaluate("() => window.scrollY")
    y = a["y"] + scroll - 8
    clip = {"x": 0, "y": y, "width": page.viewport_size["width"], "height": b["y"] + scroll + b["height"] + 8 - y}
    page.screenshot(path=str(SHOTS / name), full_page=True, clip=clip)


def unfocus(page: Any) -> None:
    """Nothing focused: a key goes to the page (as after a click on the page's background)."""
    page.evaluate("() => document.activeElement && document.activeElement.blur()")


def press(page: Any, key: str, **expected: str) -> None:
    page.keyboard.press(key)
    wait_where(page, **expected)


def test_keys_details_link_and_report_at_1440(page: Any, tmp_path: Any) -> None:
    """Keyboard only: `?` lists the keys, keys move the grid, Enter opens a cell's details, the copied
    link reopens the same cell in a new page, the report opens in a browser with the network off."""
    loaded = loading.LOCAL_A[0]
    page.set_viewport_size({"width": 1440, "height": 900})
    page.get_by_role("tab", name="Outputs").click()  # `?` from another tab: the grid's tab opens with the list
    unfocus(page)
    page.keyboard.press("?")
    page.locator("button[role=tab][aria-selected=true]", has_text="Ragged grid").wait_for()
    help_box = page.locator("#sv-keys-help")
    help_box.get_by_text("next / previous violation").wait_for()
    assert help_box.is_visible()
    page.keyboard.press("Escape")
    help_box.wait_for(state="hidden")
    first = loaded.report.first_violation
    start = where(page)
    assert start == {"trace": "--trace", "run": MINE, "step": str(first.step_index), "row": str(first.row)}
    press(page, ".", step=str(first.step_index + 1))
    press(page, ",", step=str(first.step_index))
    later = next(v for v in loaded.report.violations if (v.step_index, v.row) > (first.step_index, first.row))
    page.get_by_role("tab", name="Acceptance").focus()
    page.keyboard.press("Enter")  # another tab open: `n` brings the grid back with the violation
    page.locator("button[role=tab][aria-selected=true]", has_text="Acceptance").wait_for()
    unfocus(page)
    press(page, "n", step=str(later.step_index), row=str(later.row))
    page.locator("button[role=tab][aria-selected=true]", has_text="Ragged grid").wait_for()
    press(page, "N", step=str(first.step_index), row=str(first.row))
    rows = [r.row for r in loaded.step_slots(first.step_index).rows]
    press(page, "j", row=str(rows[rows.index(first.row) + 1]))
    press(page, "k", row=str(first.row))
    # Keys typed into a field are the field's: the step box takes a "." and the grid stays.
    page.locator("#sv-step input[type=number]").focus()
    page.keyboard.press(".")
    page.wait_for_timeout(800)
    assert where(page)["step"] == str(first.step_index)
    unfocus(page)
    page.keyboard.press("Enter")
    panel = page.locator("#sv-details .sv-cell")
    panel.wait_for()
    text = panel.inner_text()
    assert f"{first.row} · sequence {first.seq_id}" in text and "position expected" in text
    assert f"invariant {int(first.invariant)} {first.name}" in text  # the invariant and what it says
    col = int(panel.get_attribute("data-col"))
    page.keyboard.press("l")
    page.wait_for_function(f"() => document.querySelector('#sv-details .sv-cell')?.dataset.col === '{col + 1}'")
    settle(page)
    shot(page, "36-details-1440.png", "#sv-grid", "#sv-details")

    # The link to this cell, copied (the button pressed from the keyboard), reopens it in a new page.
    page.locator("#sv-copy-link").focus()
    page.keyboard.press("Enter")
    box = page.locator("#sv-link textarea, #sv-link input").first
    box.wait_for()
    page.wait_for_function("() => (document.querySelector('#sv-link textarea, #sv-link input') || {}).value")
    link = box.input_value()
    shot(page, "36-shared-link-1440.png", "#sv-grid", "#sv-link")
    assert "trace=--trace" in link and f"step={first.step_index}" in link and "/" not in link.split("?")[1]
    other = page.context.browser.new_page(viewport={"width": 1440, "height": 900})
    try:
        other.goto(link)
        wait_where(other, trace="--trace", step=str(first.step_index), row=str(first.row))
        assert inspected(other) == "A"
        settle(other)
        other.screenshot(path=str(SHOTS / "36-link-opened-1440.png"))  # the first screen, as a colleague sees it
        # A link into slot B, on another tab: B's run, B inspected, its picker naming it, that tab open.
        name = "default-eqspec-stale-kv.json.gz"
        other.goto(link.split("?")[0] + f"?slot=B&trace={name}&step=3&row=2&tab=invariants")
        wait_where(other, trace=name, step="3", row="2")
        assert inspected(other) == "B" and other.locator("#sv-bundled-b input").input_value() == name
        assert other.locator("button[role=tab][aria-selected=true]").inner_text().strip() == "Invariants"
        assert "fault column-positions" in other.locator("#sv-summary-a").inner_text()  # A kept the user's run
    finally:
        other.close()

    # The report: one file, opened with the network off, asking for nothing.
    page.locator("#sv-report").focus()
    page.keyboard.press("Enter")
    with page.expect_download() as download:
        page.locator("#sv-report-file a").first.focus()
        page.keyboard.press("Enter")
    saved = tmp_path / "finding.html"
    download.value.save_as(saved)
    context = page.context.browser.new_context(offline=True)
    try:
        asked: list[str] = []
        offline = context.new_page()
        offline.on("request", lambda request: asked.append(request.url))
        offline.goto(saved.as_uri())
        offline.get_by_text("Desync begins at step").first.wait_for()
        assert offline.locator("svg.sv-grid-svg rect").count() > 0
        assert asked == [saved.as_uri()], asked  # the file itself, nothing else
    finally:
        context.close()


def test_touch_opens_a_cell_and_the_keys_at_390(page: Any) -> None:
    """A phone: a tap on the dark red cell opens its details; the keys list is a button away."""
    first = loading.LOCAL_A[0].report.first_violation
    phone = page.context.browser.new_page(viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True)
    try:
        phone.set_default_timeout(60_000)
        phone.goto(page.url.split("?")[0])
        phone.wait_for_function(
            "() => (document.querySelector('#sv-grid .js-plotly-plot') || {}).__svFit?.endsWith(':narrow')"
        )
        settle(phone)
        cell = phone.locator(f"#sv-grid {FIRST_CELL}").first
        cell.scroll_into_view_if_needed()
        box = cell.bounding_box()
        assert box["width"] >= 16 and box["height"] >= 16  # a finger finds it
        phone.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        panel = phone.locator("#sv-details .sv-cell")
        panel.wait_for()
        assert panel.get_attribute("data-row") == str(first.row)
        assert "differs" in panel.inner_text() and f"invariant {int(first.invariant)}" in panel.inner_text()
        panel.scroll_into_view_if_needed()
        settle(phone)
        phone.screenshot(path=str(SHOTS / "36-details-390.png"))
        keys = phone.locator("#sv-keys")
        assert keys.bounding_box()["height"] >= 32  # a tap target
        keys.tap()
        phone.locator("#sv-keys-help").get_by_text("next / previous step").wait_for()
    finally:
        phone.close()
