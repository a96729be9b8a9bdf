"""Starting the app prints nothing but its address: no warning from Gradio about the app's own handlers."""

from __future__ import annotations

import warnings

import app


def test_building_the_app_warns_nothing() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        demo = app.build_app()
    demo.close()
    said = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if issubclass(w.category, UserWarning)]
    assert said == [], said
