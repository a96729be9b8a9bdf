"""`specviz runs DIR`: the table as text, JSON and CSV, sorting, the cache file, one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from specviz.analysis.check import check_trace
from specviz.analysis.runs import COLUMNS
from specviz.cli import main
from specviz.trace.io import open_trace

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "traces"
NAMES = ["default-eqspec.json.gz", "default-eqspec-stale-kv.json.gz", "default-exspec-row-mixup.json.gz"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cli-runs")
    for name in NAMES:
        shutil.copy(TRACES / name, folder / name)
    (folder / "broken.json").write_text("{not json")
    return folder


def test_json_parses_and_each_run_says_what_check_says(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", str(folder), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    runs = {r["file"]: r for r in payload["runs"]}
    assert sorted(runs) == sorted([*NAMES, "broken.json"])
    for name in NAMES:
        assert list(runs[name]) == list(COLUMNS)
        report = check_trace(open_trace(folder / name))
        first = report.first_violation
        assert runs[name]["verdict"] == report.verdict
        assert runs[name]["first_violation_step"] == (first.step if first else None)
    assert runs["broken.json"]["error"].startswith("not valid JSON")


def test_text_table_sorted_and_reversed(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", str(folder), "--sort", "verdict", "--reverse", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("file") and len(lines) == 1 + len(NAMES) + 1
    assert "desync" in lines[1] and "clean" in lines[3] and "not valid JSON" in lines[4]  # unknowns last
    assert err == ""


def test_csv_has_every_column(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "runs.csv"
    assert main(["runs", str(folder), "--csv", str(out)]) == 0
    frame = pd.read_csv(out)
    assert list(frame.columns) == list(COLUMNS) and len(frame) == len(NAMES) + 1
    capsys.readouterr()
    assert main(["runs", str(folder), "--csv", str(out)]) == 2  # exists: --force, as for every output
    assert "--force" in capsys.readouterr().err


def test_progress_on_request_counts_files(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", str(folder), "--json", "--progress"]) == 0
    assert f"{len(NAMES) + 1}/{len(NAMES) + 1}" in capsys.readouterr().err


def test_cache_file_second_run_is_identical(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache.json"
    assert main(["runs", str(folder), "--json", "--cache", str(cache)]) == 0
    first = capsys.readouterr().out
    assert main(["runs", str(folder), "--json", "--cache", str(cache)]) == 0
    assert capsys.readouterr().out == first and cache.is_file()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["/no/such/folder"], "no such folder"),
        ([str(TRACES / NAMES[0])], "not a folder"),
        ([str(TRACES), "--sort", "nope"], "no column"),
        ([str(TRACES), "--cache", str(TRACES / NAMES[0])], "not a runs cache"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and err.startswith("specviz: error:")
