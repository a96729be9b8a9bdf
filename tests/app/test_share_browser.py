"""Issue 36 in a real browser, on an app opened with `--trace PATH` (as `python app.py --trace`
does): the user's run is never dropped by focus, the picker names it, slot B says it is an example.

One page session walks every path, so the file costs one server and one browser.
"""

from __future__ import annotations

from typing import Any

import pytest
from browser import CHROMIUM, served_page, settle

import app
from specviz.app import loading

MINE = "default-eqspec-column-positions.json.gz"  # stands for the user's own file, opened with --trace

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
