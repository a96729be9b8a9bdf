"""Headless Chromium for the app's browser tests: where it is, how it is launched, when a page has settled."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the checkout
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


# True once the figures' and table headers' boxes have not moved for 5 animation frames.
STABLE_JS = """() => {
    const sig = JSON.stringify([...document.querySelectorAll('.js-plotly-plot .main-svg, th')]
        .map((e) => { const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; }));
    window.__svSame = window.__svSig === sig ? (window.__svSame || 0) + 1 : 0;
    window.__svSig = sig;
    return window.__svSame >= 5;
}"""


def settle(page: Any) -> None:
    """Wait until Gradio has no event in flight (its loading overlay dims the figures) and the
    layout has stopped moving (a condition, not a duration: issue 26)."""
    page.wait_for_function("() => !document.querySelector('.eta-bar, .progress-text, .generating')")
    page.wait_for_function(STABLE_JS, polling="raf")


@contextlib.contextmanager
def served_page(demo: Any) -> Iterator[Any]:
    """`demo` served on a free local port and opened in headless Chromium (1400 x 1000, 60 s
    timeouts); the page is yielded, and the browser and the server are closed after, either way."""
    from playwright.sync_api import sync_playwright

    import app

    _, url, _ = app.launch(demo, prevent_thread_lock=True, server_name="127.0.0.1", quiet=True)
    SHOTS.mkdir(exist_ok=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            try:
                tab = browser.new_page(viewport={"width": 1400, "height": 1000})
                tab.set_default_timeout(60_000)
                tab.goto(url)
                yield tab
            finally:
                browser.close()
    finally:
        demo.close()
