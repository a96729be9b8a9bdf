"""`specviz.analysis.runs`: one row per trace of a folder, each saying what `check_trace` says of
that file opened on its own (the oracle), one-line errors for everything else, no symlink followed
out of the folder, and a cache that serves only unchanged files checked by the same code."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from specviz.analysis.check import check_trace
from specviz.analysis.metrics import summary
from specviz.analysis.runs import COLUMNS, OUTSIDE, RunRow, find_traces, render_runs, scan_runs, sort_rows
from specviz.analysis.runs_cache import RunsCache
from specviz.errors import SpecvizError
from specviz.trace.io import load_trace, open_trace, save_trace
from specviz.trace.synthetic import synthetic_trace, write_synthetic_parquet

TRACES = Path(__file__).resolve().parents[2] / "traces"
TRACE_FILES = [
    "clean.json.gz",
    "clean.parquet",
    "desync.parquet",
    "positions.json",
    "stale-kv.json.gz",
    "sweep-7",  # Parquet without the suffix: found by content
    "alias.json.gz",  # a symlink inside the folder
]
ERROR_FILES = ["corrupt.json.gz", "truncated.parquet", "fake.parquet", "other.json", "escape.json.gz"]


def _desync(trace):
    """One row fed a position one past where its token sits: a POSITIONS violation at that row."""
    trace.steps[1].rows[-1].position_ids[0] += 1
    return trace


def _make_folder(root: Path) -> Path:
    folder, outside = root / "runs", root / "elsewhere"
    folder.mkdir()
    outside.mkdir()
    save_trace(synthetic_trace(6, 3, 3, 8), folder / "clean.json.gz")
    write_synthetic_parquet(folder / "clean.parquet", 6, 3, 3, 8, seed=1)
    save_trace(_desync(synthetic_trace(5, 2, 2, 6)), folder / "desync.parquet")
    save_trace(_desync(synthetic_trace(4, 2, 3, 6, seed=2)), folder / "positions.json")
    shutil.copy(TRACES / "default-eqspec-stale-kv.json.gz", folder / "stale-kv.json.gz")  # a real faulted run
    shutil.copy(folder / "clean.parquet", folder / "sweep-7")
    (folder / "alias.json.gz").symlink_to("clean.json.gz")
    # Not traces, or broken ones: each a row with one line of error.
    (folder / "corrupt.json.gz").write_bytes(gzip.compress(b'{"format": "specviz-trace", "hea')[:-9])
    raw = (folder / "clean.parquet").read_bytes()
    (folder / "truncated.parquet").write_bytes(raw[: len(raw) // 2])  # PAR1, then no footer: a killed writer
    (folder / "fake.parquet").write_text("step,row\n1,2\n")
    (folder / "other.json").write_text(json.dumps({"name": "a package.json, say"}))
    save_trace(synthetic_trace(3, 2, 2, 4), outside / "secret.json.gz")
    (folder / "escape.json.gz").symlink_to(outside / "secret.json.gz")  # listed, never opened
    (folder / "escape-by-content").symlink_to(outside / "secret.json.gz")  # not trace-named: not listed
    (folder / "notes.txt").write_text("not a trace, not named like one\n")
    (folder / "loop").symlink_to(".")  # a symlinked folder: never descended into
    (folder / "nested").mkdir()
    save_trace(synthetic_trace(3, 2, 2, 4), folder / "nested" / "deep.json.gz")
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make_folder(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def rows(folder: Path) -> dict[str, RunRow]:
    return {r.file: r for r in scan_runs(folder)}


def test_the_folder_lists_traces_and_trace_named_files_only(folder: Path, rows: dict[str, RunRow]) -> None:
    assert sorted(rows) == sorted(TRACE_FILES + ERROR_FILES)
    recursive = [r.file for r in scan_runs(folder, recursive=True)]
    assert "nested/deep.json.gz" in recursive and not any(f.startswith("loop/") for f in recursive)
    assert sorted(set(recursive) - {"nested/deep.json.gz"}) == sorted(rows)


@pytest.mark.parametrize("name", TRACE_FILES)
def test_each_row_says_what_check_says_of_its_file(folder: Path, rows: dict[str, RunRow], name: str) -> None:
    row, path = rows[name], folder / name
    assert row.error is None
    trace = open_trace(path)
    report = check_trace(trace)  # the oracle: the file checked on its own
    assert row.verdict == report.verdict and row.violations == report.violation_count
    first = report.first_violation
    got = (row.first_violation_step, row.first_violation_row, row.first_violation_invariant, row.first_violation_name)
    assert got == ((first.step, first.row, int(first.invariant), first.name) if first else (None,) * 4)
    assert row.exact_match == report.exact_match
    metrics = summary(load_trace(path))  # the metrics' own walk, not the check's sums
    assert (row.acceptance_rate, row.mean_acceptance_length) == (
        metrics["acceptance_rate"],
        metrics["mean_acceptance_length"],
    )
    assert row.steps == metrics["steps"] and row.prompts == metrics["num_prompts"]
    assert row.row_steps == sum(len(step.rows) for step in load_trace(path).steps)
    h = trace.header
    assert (row.method, row.fault, row.target, row.draft) == (h.method, h.fault, h.target.name, h.draft.name)
    assert (row.batch_size, row.draft_k, row.schema_version) == (h.batch_size, h.draft_k, h.schema_version)
    assert row.container == ("json" if ".json" in name else "parquet")
    assert row.size == path.stat().st_size and row.mtime.endswith("Z")


def test_the_runs_cover_clean_and_broken_runs(rows: dict[str, RunRow]) -> None:
    """The folder is a fair test: the oracle itself says clean for some and desync for others."""
    assert rows["clean.parquet"].verdict == rows["clean.json.gz"].verdict == "clean"
    assert rows["desync.parquet"].first_violation_name == rows["positions.json"].first_violation_name
    assert rows["desync.parquet"].first_violation_name == "position-contiguity"
    assert rows["stale-kv.json.gz"].verdict == "desync"


@pytest.mark.parametrize("name", ERROR_FILES)
def test_a_file_that_is_not_a_readable_trace_is_one_line_of_error(
    folder: Path, rows: dict[str, RunRow], name: str
) -> None:
    row = rows[name]
    assert row.error and "\n" not in row.error and "Traceback" not in row.error
    assert str(folder) not in row.error  # the file column names it
    assert row.verdict is None
    assert not row.error.startswith(("AttributeError", "KeyError", "TypeError", "IndexError"))  # no bug of ours
    if name == "escape.json.gz":
        assert row.error == OUTSIDE and row.size is None  # not even stat'ed


def test_a_missing_folder_or_a_file_is_one_line_of_error(folder: Path) -> None:
    for path, needle in ((folder / "absent", "no such folder"), (folder / "notes.txt", "not a folder")):
        with pytest.raises(SpecvizError, match=needle):
            scan_runs(path)


def test_progress_counts_files_done_of_files_found(folder: Path) -> None:
    seen: list[tuple[int, int]] = []
    scan_runs(folder, progress=lambda done, total: seen.append((done, total)))
    total = len(find_traces(folder))
    assert seen == [(i, total) for i in range(1, total + 1)]


def test_sort_keeps_unknowns_last_both_ways(rows: dict[str, RunRow]) -> None:
    listed = list(rows.values())
    for reverse in (False, True):
        ordered = sort_rows(listed, "exact_match", reverse)
        values = [r.exact_match for r in ordered]
        known = [v for v in values if v is not None]
        assert known == sorted(known, reverse=reverse)
        assert values[len(known) :] == [None] * (len(values) - len(known))
    with pytest.raises(SpecvizError, match="no column"):
        sort_rows(listed, "nonsense")


def test_the_text_table_has_one_aligned_line_per_run(rows: dict[str, RunRow]) -> None:
    text = render_runs(list(rows.values()))
    lines = text.splitlines()
    assert len(lines) == 1 + len(rows)
    start = lines[0].index("verdict")
    assert all(line[start:].startswith(("verdict", "clean", "desync", "ERROR")) for line in lines)


def test_the_cache_serves_unchanged_files_only(folder: Path, tmp_path: Path, rows: dict[str, RunRow]) -> None:
    path = tmp_path / "runs-cache.json"
    first = scan_runs(folder, cache=RunsCache(path))
    assert json.loads(path.read_text())["format"] == "specviz-runs-cache"
    cache = RunsCache(path)
    again = scan_runs(folder, cache=cache)
    assert again == first and [r.to_dict() for r in again] == [rows[r.file].to_dict() for r in again]
    assert cache.hits == len(TRACE_FILES)  # error rows are never cached: checked again
    # A rewritten file (new mtime) is checked again; the others still come from the cache.
    touched = folder / "positions.json"
    stat = touched.stat()
    os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    try:
        cache = RunsCache(path)
        scan_runs(folder, cache=cache)
        assert cache.hits == len(TRACE_FILES) - 1
    finally:
        os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_the_cache_of_other_code_is_ignored_and_a_foreign_file_never_overwritten(folder: Path, tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    scan_runs(folder, cache=RunsCache(path))
    data = json.loads(path.read_text())
    data["checker"] = "another specviz"
    path.write_text(json.dumps(data))
    cache = RunsCache(path)
    scan_runs(folder, cache=cache)
    assert cache.hits == 0
    foreign = tmp_path / "trace.json.gz"
    shutil.copy(folder / "clean.json.gz", foreign)
    before = foreign.read_bytes()
    with pytest.raises(SpecvizError, match="not a runs cache"):
        RunsCache(foreign)
    assert foreign.read_bytes() == before


def test_a_cache_inside_the_folder_is_not_a_run(folder: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(folder / "clean.json.gz", copy)
    scan_runs(copy, cache=RunsCache(copy / "cache.json"))
    assert [r.file for r in scan_runs(copy, cache=RunsCache(copy / "cache.json"))] == ["clean.json.gz"]
    assert [r.file for r in scan_runs(copy)] == ["cache.json", "clean.json.gz"]  # without it: a non-trace


def test_columns_are_the_row_fields() -> None:
    assert COLUMNS[0] == "file" and COLUMNS[-1] == "error" and len(set(COLUMNS)) == len(COLUMNS)


def test_a_header_cannot_break_the_table() -> None:
    """A model name is free text of whoever wrote the trace: no line breaks or escapes reach the terminal."""
    odd = RunRow(file="x.json", method="eqspec", target="evil\x1b[2J\nname" + "x" * 500, draft="d", verdict="clean")
    text = render_runs([odd])
    assert len(text.splitlines()) == 2 and "\x1b" not in text and "..." in text
