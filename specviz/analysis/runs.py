"""One table of runs over a folder of traces (`specviz runs DIR`): a CI history or a sweep at a glance.

Each trace is opened with the same loader as `specviz check` (`open_trace`: a Parquet trace is
streamed a row group at a time) and checked with the same `check_trace`, so a row says exactly what
`check` says of that file; its acceptance numbers are the sums the check's own walk gathered
(`Report.totals`), not a second walk. A file that cannot be read or checked is a row whose `error`
holds one line: one broken file never costs the table.

Which files: `*.json` and `*.json.gz` by name (JSON cannot be told from other text cheaply), any
regular file whose content starts with Parquet's magic, and `*.parquet` (so a mislabelled one is
reported rather than silently left out). A symlink whose target lies outside the folder is never
followed, and symlinked folders are never descended into (no loops, no escapes).
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from specviz.analysis.check import check_trace
from specviz.analysis.metrics import totals_of
from specviz.analysis.report import Report
from specviz.errors import SpecvizError, first_line
from specviz.trace.columnar import ColumnarError, is_parquet
from specviz.trace.io import TraceError, open_trace
from specviz.trace.naming import model_label
from specviz.trace.schema import Trace

if TYPE_CHECKING:
    import pandas as pd

JSON_SUFFIXES = (".json", ".json.gz")
PARQUET_SUFFIX = ".parquet"
OUTSIDE = "a symlink to outside the folder; not followed"

Progress = Callable[[int, int], None]  # (files done, files in all)


class RowCache(Protocol):
    """What the scan asks of a cache (`specviz.analysis.runs_cache.RunsCache`)."""

    path: Path

    def row_of(self, path: Path, name: str, check: Callable[[Path, str], RunRow]) -> RunRow: ...

    def save(self) -> None: ...


@dataclass
class RunRow:
    """One run (one file): what `check` says of it, or the one-line `error` that stopped it.

    Every field but `file` is None where unknown (an error, no reference, no drafts); columns are
    added, never renamed, like the steps frame's."""

    file: str  # relative to the folder, with / separators
    container: str | None = None  # "json" or "parquet", by content
    method: str | None = None
    fault: str | None = None
    target: str | None = None  # model names as the header gives them
    draft: str | None = None
    batch_size: int | None = None
    draft_k: int | None = None
    prompts: int | None = None
    steps: int | None = None  # verify steps
    row_steps: int | None = None  # (step, batch row) records
    complete: bool | None = None  # False: an interrupted run
    verdict: str | None = None  # the run verdict of `check`
    violations: int | None = None
    first_violation_step: int | None = None  # StepRecord.step, as `check` prints it
    first_violation_row: int | None = None
    first_violation_seq_id: int | None = None
    first_violation_invariant: int | None = None
    first_violation_name: str | None = None
    exact_match: float | None = None  # share of prompts equal to their reference
    acceptance_rate: float | None = None  # accepted drafts / drafted
    mean_acceptance_length: float | None = None  # 1 + accepted / verifies
    schema_version: int | None = None
    size: int | None = None  # bytes
    mtime: str | None = None  # last modified, ISO 8601 UTC
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


COLUMNS = tuple(f.name for f in fields(RunRow))


@dataclass(frozen=True)
class Found:
    """A file the scan will turn into a row; `refused`: why it is listed without being opened."""

    path: Path
    name: str
    refused: str | None = None


# ----------------------------------------------------------------------------- finding the files


def find_traces(folder: str | os.PathLike[str], recursive: bool = False, skip: Sequence[Path] = ()) -> list[Found]:
    """The trace files of `folder` (its subfolders too with `recursive`), in name order.

    `skip`: files never listed (the cache file, when it lies inside the folder)."""
    root = Path(folder)
    if not root.is_dir():
        raise SpecvizError(f"{root}: {'not a folder' if root.exists() else 'no such folder'}")
    real_root = os.path.realpath(root)
    skipped = {os.path.realpath(p) for p in skip}
    return [f for f in _walk(root, root, real_root, recursive) if os.path.realpath(f.path) not in skipped]


def _walk(folder: Path, root: Path, real_root: str, recursive: bool) -> Iterator[Found]:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:  # an unreadable folder (no permission) is one row saying so, not the end
        yield Found(folder, _relative(folder, root), f"cannot list this folder ({exc.strerror or exc})")
        return
    for entry in entries:
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            if recursive:
                yield from _walk(path, root, real_root, recursive)
            continue
        name = _relative(path, root)
        if entry.is_symlink():
            target = os.path.realpath(path)
            if os.path.commonpath([target, real_root]) != real_root:
                if _named_like_trace(entry.name):  # say why a trace-like name is missing; others are not ours
                    yield Found(path, name, OUTSIDE)
                continue
            if os.path.isdir(target):
                continue  # a symlinked folder inside: its files are listed under their own names
        if _named_like_trace(entry.name) or is_parquet(path):
            yield Found(path, name)


def _named_like_trace(name: str) -> bool:
    return name.endswith(JSON_SUFFIXES) or name.endswith(PARQUET_SUFFIX)


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


# ----------------------------------------------------------------------------- one row per file


def run_row(path: str | os.PathLike[str], name: str | None = None) -> RunRow:
    """Open and check one trace file; any failure becomes the row's one-line `error`."""
    path = Path(path)
    row = RunRow(file=name if name is not None else path.name)
    try:
        info = path.stat()
    except OSError as exc:
        row.error = f"cannot read ({exc.strerror or exc})"
        return row
    row.size, row.mtime = info.st_size, _utc(info.st_mtime)
    parquet = is_parquet(path)
    row.container = "parquet" if parquet else "json"
    if not parquet and path.name.endswith(PARQUET_SUFFIX):
        row.container = None
        row.error = "not a Parquet file (it does not start with PAR1)"
        return row
    try:
        trace = open_trace(path)
        describe(row, trace)
        judge(row, trace, check_trace(trace))
    except (TraceError, ColumnarError) as exc:  # the loaders' own one-line messages
        row.error = one_line(exc, path)
    except MemoryError:
        row.error = "out of memory while checking it"
    except Exception as exc:  # noqa: BLE001 - one file must never cost the table; its type says what broke
        row.error = f"{type(exc).__name__}: {one_line(exc, path)}"
    return row


def describe(row: RunRow, trace: Trace) -> None:
    """The header's side of the row: what was run."""
    h = trace.header
    row.method, row.fault, row.complete, row.schema_version = h.method, h.fault, h.complete, h.schema_version
    row.target = h.target.name
    row.draft = h.draft.name if h.draft is not None else None
    row.batch_size, row.draft_k = trace.batch_rows, h.draft_k  # the effective batch
    row.prompts = len(trace.sequences)
    row.row_steps = row_steps(trace)


def judge(row: RunRow, trace: Trace, report: Report) -> None:
    """The check's side of the row: its verdict, first violation and the sums of its own walk."""
    row.verdict, row.violations, row.exact_match = report.verdict, report.violation_count, report.exact_match
    first = report.first_violation
    if first is not None:
        row.first_violation_step, row.first_violation_row = first.step, first.row
        row.first_violation_seq_id = first.seq_id
        row.first_violation_invariant, row.first_violation_name = int(first.invariant), first.name
    totals = totals_of(trace, report.totals)  # the check gathered them: no second read of the steps
    row.steps = totals.steps
    row.acceptance_rate, row.mean_acceptance_length = totals.acceptance.rate, totals.acceptance.mean_length


def row_steps(trace: Trace) -> int:
    """(step, row) records: a Parquet trace's table row count is in its footer (one table row per
    row-step), so its steps are not read for it; a JSON trace's steps are in memory already."""
    rows = getattr(getattr(trace.steps, "source", None), "num_rows", None)
    if isinstance(rows, int):
        return rows
    return sum(len(step.rows) for step in trace.steps)


def one_line(exc: BaseException, path: Path | None = None) -> str:
    """The message's first line, without the path the `file` column already names."""
    text = first_line(exc)
    if path is not None:
        text = text.removeprefix(f"{path}: ")
    return text


def _utc(seconds: float) -> str:
    return _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ----------------------------------------------------------------------------- the table


def scan_runs(
    folder: str | os.PathLike[str],
    recursive: bool = False,
    cache: RowCache | None = None,
    progress: Progress | None = None,
) -> list[RunRow]:
    """One row per trace file of `folder`, in name order (`find_traces` says which files).

    `cache`: rows of files unchanged since it saw them (path, size, mtime_ns) are reused; it is
    saved even when the scan is interrupted, so a long first scan is not lost to Ctrl-C.
    `progress(done, total)` is called after each file."""
    skip = [cache.path] if cache is not None else []
    found = find_traces(folder, recursive, skip)
    rows: list[RunRow] = []
    try:
        for f in found:
            rows.append(_row_of(f, cache))
            if progress is not None:
                progress(len(rows), len(found))
    finally:
        if cache is not None:
            cache.save()
    return rows


def _row_of(found: Found, cache: RowCache | None) -> RunRow:
    if found.refused is not None:
        return RunRow(file=found.name, error=found.refused)
    if cache is None:
        return run_row(found.path, found.name)
    return cache.row_of(found.path, found.name, run_row)


def check_column(column: str) -> None:
    """Refuse a column the table does not have, naming the ones it has."""
    if column not in COLUMNS:
        raise SpecvizError(f"--sort: no column {column!r} (columns: {', '.join(COLUMNS)})")


def sort_rows(rows: list[RunRow], column: str, reverse: bool = False) -> list[RunRow]:
    """Sorted by one column, unknown values (None) last either way; ties keep name order."""
    check_column(column)
    known = [r for r in rows if getattr(r, column) is not None]
    unknown = [r for r in rows if getattr(r, column) is None]
    return sorted(known, key=lambda r: getattr(r, column), reverse=reverse) + unknown


def runs_frame(rows: Sequence[RunRow]) -> pd.DataFrame:
    """The table as a pandas DataFrame, one row per run, columns `COLUMNS` (for your own analysis)."""
    import pandas as pd

    return pd.DataFrame([r.to_dict() for r in rows], columns=list(COLUMNS))


# ----------------------------------------------------------------------------- text


# (heading, how a row shows it): the columns a terminal has room for; --json and --csv have all.
TEXT_COLUMNS: tuple[tuple[str, Callable[[RunRow], Any]], ...] = (
    ("file", lambda r: r.file),
    ("method", lambda r: method_label(r)),
    ("target / draft", lambda r: r.target and f"{model_label(r.target)} / {model_label(r.draft) or '-'}"),
    ("batch", lambda r: r.batch_size),
    ("k", lambda r: r.draft_k),
    ("prompts", lambda r: r.prompts),
    ("row-steps", lambda r: r.row_steps),
    ("verdict", lambda r: "ERROR" if r.error else r.verdict),
    ("first violation", lambda r: first_violation_text(r)),
    ("exact", lambda r: share_text(r.exact_match)),
    ("accept", lambda r: share_text(r.acceptance_rate)),
    ("modified (UTC)", lambda r: r.mtime and r.mtime[:16].replace("T", " ")),
    ("error", lambda r: r.error),
)


def render_runs(rows: Sequence[RunRow]) -> str:
    """An aligned text table, one line per run ("-": unknown); columns of no row are left out."""
    shown = [(head, cell) for head, cell in TEXT_COLUMNS if head != "error" or any(r.error for r in rows)]
    table = [[head for head, _ in shown]]
    # The error is the last column: nothing after it to align, so it is cut only where it runs on.
    limits = [4 * MAX_CELL if head == "error" else MAX_CELL for head, _ in shown]
    table += [[_text(cell(r), limit) for (_, cell), limit in zip(shown, limits)] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(shown))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in table]
    return "\n".join(lines)


def method_label(r: RunRow) -> str | None:
    """The method, with its fault when it has one (`eqspec+stale-kv`)."""
    return r.method if not r.fault else f"{r.method}+{r.fault}"


def first_violation_text(r: RunRow) -> str | None:
    if r.first_violation_step is None:
        return None
    return f"step {r.first_violation_step}, row {r.first_violation_row}: {r.first_violation_name}"


def share_text(value: float | None) -> str | None:
    """A share (exact match, acceptance) to three places."""
    return None if value is None else f"{value:.3f}"


MAX_CELL = 64  # a cell longer than this is cut ("..."), so one odd header cannot widen every line


def _text(value: Any, limit: int = MAX_CELL) -> str:
    """One line of printable text: a model name is the trace writer's free text, and a terminal
    must not receive its control characters (escape sequences) or its line breaks."""
    if value is None or value == "":
        return "-"
    text = "".join(c if c.isprintable() else "?" for c in " ".join(str(value).split()))
    return text if len(text) <= limit else text[: limit - 3] + "..."
