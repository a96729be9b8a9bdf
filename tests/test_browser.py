"""The app in a real browser (headless Chromium via Playwright): a new user picks a faulty bundled
trace, sees the ragged grid, jumps to the first violation and finds the divergent token.
Screenshots land in test-output/ (gitignored) for a human to look at.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import app

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "test-output"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
FAULTY = "default-eqspec-column-positions.json.gz"
FIRST_CELL = "path[style*='rgb(127, 29, 29)']"  # the first-violation outline (palette.FIRST_FLAG_COLOR)

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")


def settle(page: Any) -> None:
    """Wait until Gradio has no event in flight (its loading overlay dims the figures)."""
    page.wait_for_function("() => !document.querySelector('.eta-bar, .progress-text, .generating')")
    page.wait_for_timeout(600)


@pytest.fixture(scope="module")
def page() -> Any:
    if FAULTY not in app.bundled_traces():
        pytest.skip(f"{FAULTY} is not bundled (run tools/make_traces.py)")
    demo = app.build_app()
    _, url, _ = app.launch(demo, prevent_thread_lock=True, server_name="127.0.0.1", quiet=True)
    SHOTS.mkdir(exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            tab.set_default_timeout(60_000)
            tab.goto(url)
            yield tab
        finally:
            browser.close()
            demo.close()


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
