"""Headless Chromium for the app's browser tests: where it is, how it is launched, when a page has settled."""

from __future__ import annotations

import shutil
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
