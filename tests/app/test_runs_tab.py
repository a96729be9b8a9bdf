"""`python app.py --runs DIR`: the folder's table on the page, a picked run opened in A or B with
the verdict `check_trace` gives that file on its own, only names from the table, and nothing at all
in public mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from runs_folder import make_runs_folder

import app as app_module
from specviz.analysis.check import check_trace
from specviz.app import runs_tab
from specviz.errors import SpecvizError
from specviz.trace.io import open_trace


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return make_runs_folder(tmp_path)


@pytest.fixture(autouse=True)
def no_folder_left() -> Any:
    """The listed folder is the server's one state: empty before and after each test (the app and
    the events read the same list object)."""
    runs_tab.FOLDER.clear()
    yield
    runs_tab.FOLDER.clear()


@pytest.fixture
def listed(folder: Path) -> Any:
    runs_tab.open_runs_folder(folder, progress=False)
    return app_module.build_app()


def _handler(demo: Any, api_name: str) -> Any:
    return next(f for f in demo.fns.values() if f.api_name == api_name).fn


def test_the_page_lists_the_folder_and_opens_a_run_with_its_own_verdict(folder: Path, listed: Any) -> None:
    table = next(b for b in listed.blocks.values() if getattr(b, "elem_id", None) == "sv-runs-table")
    files = [row[0] for row in table.value["data"]]
    assert files == ["clean.json.gz", "corrupt.json", "desync.parquet"]
    verdicts = {row[0]: row[5] for row in table.value["data"]}
    assert verdicts["corrupt.json"] == "error"
    for name, label in (("desync.parquet", "a"), ("clean.json.gz", "b")):
        expected = check_trace(open_trace(folder / name))
        assert verdicts[name] == expected.verdict
        result = _handler(listed, f"open_listed_{label}")(name, None, 64, False)
        loaded = next(v for v in result.values() if type(v).__name__ == "LoadedRun")
        assert loaded.report.verdict == expected.verdict
        assert loaded.report.first_violation == expected.first_violation
    assert expected.verdict == "clean" and verdicts["desync.parquet"] == "desync"


@pytest.mark.parametrize("name", ["corrupt.json", "../etc/passwd", str(Path("/etc/passwd")), "", None])
def test_only_openable_names_from_the_table_are_opened(listed: Any, name: Any) -> None:
    result = _handler(listed, "open_listed_a")(name, None, 64, False)
    (status,) = result.values()  # one output: the slot's status line; its run stays
    assert status["visible"] and "⚠️" in status["value"] and "\n" not in status["value"]


def test_public_mode_refuses_the_folder_before_reading_it(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPACE_ID", "x/y")
    monkeypatch.setattr(runs_tab, "scan_runs", lambda *a, **k: pytest.fail("a public server read a folder"))
    with pytest.raises(SpecvizError, match="refused in public mode"):
        runs_tab.open_runs_folder(folder)
    with pytest.raises(SystemExit, match="app.py: --runs lists a local folder"):
        app_module.open_runs_arg(str(folder))
    assert runs_tab.FOLDER == []


def test_a_missing_folder_exits_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no such folder"):
        app_module.open_runs_arg(str(tmp_path / "nowhere"))


def test_without_runs_the_page_has_no_section() -> None:
    demo = app_module.build_app()
    assert not any(getattr(b, "elem_id", None) == "sv-runs" for b in demo.blocks.values())
    assert not any(f.api_name and f.api_name.startswith("open_listed") for f in demo.fns.values())


def test_every_table_click_runs_with_its_own_row(listed: Any) -> None:
    """A select handler reads the clicked row from the event, so a click made while the last one is
    in flight must still run with its own row. Gradio's default trigger mode ("once") drops that
    click and "always_last" reruns with the first click's row; only "multiple" keeps it. The browser
    test clicks two rows in a row; this holds the setting where the machine is too fast to race."""
    backend_selects = [
        d for d in listed.config["dependencies"] if d["backend_fn"] and any(t[1] == "select" for t in d["targets"])
    ]
    assert len(backend_selects) == 2  # the runs table's pick and the violations table's jump
    assert {d["trigger_mode"] for d in backend_selects} == {"multiple"}
