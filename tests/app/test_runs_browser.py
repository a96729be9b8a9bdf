"""`python app.py --runs DIR` in a real browser: the folder's table is on the page, a click on a
row picks its run, and "open in B" puts that run in slot B with the verdict `check` gives it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser import CHROMIUM, SHOTS, served_page, settle
from runs_folder import make_runs_folder

import app
from specviz.analysis.check import check_trace
from specviz.app import runs_tab
from specviz.trace.io import open_trace

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_runs_folder(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def page(folder: Path) -> Any:
    runs_tab.open_runs_folder(folder, progress=False)
    try:
        with served_page(app.build_app()) as tab:
            yield tab
    finally:
        runs_tab.FOLDER.clear()


def test_a_clicked_row_opens_in_slot_b_with_its_verdict(page: Any, folder: Path) -> None:
    table = page.locator("#sv-runs-table")
    table.get_by_text("corrupt.json").first.wait_for()
    assert "Runs in" in page.locator("#sv-runs").inner_text()
    settle(page)
    expected = check_trace(open_trace(folder / "desync.parquet"))
    assert expected.verdict == "desync"

    # A click on an unreadable file's row leaves the pick alone; a readable one's becomes the pick.
    table.get_by_text("corrupt.json").filter(visible=True).first.click()
    table.get_by_text("desync.parquet").filter(visible=True).first.click()
    page.wait_for_function(
        "() => document.querySelector('#sv-runs-pick input')?.value === 'desync.parquet'", polling=100
    )
    page.locator("#sv-runs-open-b").click()
    summary = page.locator("#sv-summary-b")
    summary.get_by_text("DESYNC", exact=True).wait_for()
    settle(page)
    page.screenshot(path=str(SHOTS / "runs-opened-in-b.png"), full_page=False)
    text = summary.inner_text()
    assert "Run B" in text and "local desync.parquet" in text
    first = expected.first_violation
    assert f"Desync begins at step {first.step}, row {first.row}" in text
    assert page.locator("#sv-status-b").is_hidden()  # no error line: the run landed
