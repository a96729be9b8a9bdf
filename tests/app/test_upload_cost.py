"""Issue 23: what one public upload event costs the server, counted rather than timed (a shared CI
machine's seconds say little): the steps are walked for the metrics once, by the check, and each
whole-run figure is built once per loaded run however often the run is shown again.
The seconds and megabytes are `tools/attack_suite.py --only sessions`.
"""

from __future__ import annotations

import types
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import app
from specviz.analysis import check, metrics
from specviz.app import detail, loading
from specviz.trace.io import save_trace
from specviz.trace.synthetic import synthetic_trace
from specviz.views import LoadedRun

FIGURES = ("timeline_figure", "acceptance_figure", "acceptance_heatmap", "kv_heatmap", "drift_heatmap")


@pytest.fixture(scope="module")
def demo() -> Iterator[Any]:
    demo = app.build_app()
    try:
        yield demo
    finally:
        demo.close()


def handler(demo: Any, api_name: str) -> Callable[..., dict]:
    return next(f.fn for f in demo.fns.values() if f.api_name == api_name)


@pytest.fixture()
def upload(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[], tuple[LoadedRun, dict[Any, Any]]]:
    """The upload event of slot A in public mode, as Gradio calls it (the ownership of the file is
    `test_upload_ownership`'s business: here the session owns it)."""
    monkeypatch.setenv("SPACE_ID", "specviz/test")
    path = save_trace(synthetic_trace(6, 2, 3, 12), tmp_path / "upload.json.gz")
    monkeypatch.setattr(loading.uploads, "read_upload", lambda p, session, limit, message: Path(p).read_bytes())
    request = types.SimpleNamespace(session_hash="visitor")
    fn = handler(demo, "load_upload_a")

    def call() -> tuple[LoadedRun, dict[Any, Any]]:
        out = fn(str(path), None, 40, False, request=request)
        loaded = next(v for v in out.values() if isinstance(v, LoadedRun))
        return loaded, out

    return call


def test_the_metrics_walk_the_steps_once_per_upload(upload: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary, the A vs B table and the acceptance tab read the sums the check gathered in its
    walk (`Report.totals`): a view walking the steps again costs ~0.1 s at the public budget."""
    steps = Counter[str]()
    original = metrics.add_step

    def counted(totals: Any, step: Any, rules: Any) -> None:
        steps["added"] += 1
        original(totals, step, rules)

    monkeypatch.setattr(metrics, "add_step", counted)
    monkeypatch.setattr(check, "add_step", counted)
    loaded, out = upload()
    assert loaded.report.totals is not None and loaded.step_count > 10
    assert steps["added"] == loaded.step_count  # the check's walk, and no other
    assert any(isinstance(v, str) and "acceptance rate" in v for v in out.values())  # the numbers are shown


def test_whole_run_figures_are_built_once_per_run(upload: Any, demo: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = Counter[str]()
    for name in FIGURES:
        original = getattr(detail, name)

        def counted(*args: Any, __name: str = name, __original: Any = original) -> Any:
            builds[__name] += 1
            return __original(*args)

        monkeypatch.setattr(detail, name, counted)
    loaded, _ = upload()
    assert builds == Counter(dict.fromkeys(FIGURES, 1))
    inspect = handler(demo, "inspect")
    for _ in range(2):  # switching the inspected slot away and back redraws every tab
        inspect("B", loaded, None, 40, False)
        shown = inspect("A", loaded, None, 40, False)
    assert builds == Counter(dict.fromkeys(FIGURES, 1)), "a figure was rebuilt for a run already shown"
    assert all(fig is loaded.figures[key] for key, fig in loaded.figures.items())
    assert sum(v is loaded.figures["kv"] for v in shown.values()) == 1
    another, _ = upload()  # a new upload is a new run: its own figures
    assert another is not loaded and builds == Counter(dict.fromkeys(FIGURES, 2))
