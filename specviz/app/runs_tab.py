"""`python app.py --runs DIR` (local only): the folder's runs as one table, each openable in A or B.

The table is `specviz runs DIR`'s (`specviz.analysis.runs`): every trace of the folder checked once,
when the server starts, with a count of files on stderr. The page lists it and opens a picked run
in a slot the way `--trace PATH` opens one: streamed if Parquet, no budget (the files are the
user's own). The page sends back only a file *name*, looked up in the table the server made; no
path from the page is ever opened. In public mode (a Space) the option is refused before anything
is read: a Space reads no folder a visitor or its deployer's command line could point elsewhere.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from specviz.analysis.runs import RunRow, first_violation_text, method_label, scan_runs, share_text
from specviz.app import serve
from specviz.app.loading import load_local
from specviz.errors import SpecvizError
from specviz.views import LoadedRun

PUBLIC_RUNS_REFUSED = "--runs lists a local folder: refused in public mode (a Space reads no path a visitor chose)"

# (heading, how a row shows it), cells as `specviz runs` prints them: what a reader picks a run by;
# `specviz runs --json` has every column.
SHOWN: tuple[tuple[str, Any], ...] = (
    ("file", lambda r: r.file),
    ("method", method_label),
    ("batch", lambda r: r.batch_size),
    ("k", lambda r: r.draft_k),
    ("prompts", lambda r: r.prompts),
    ("verdict", lambda r: "error" if r.error else r.verdict),
    ("first violation", first_violation_text),
    ("exact", lambda r: share_text(r.exact_match)),
    ("acceptance", lambda r: share_text(r.acceptance_rate)),
    ("error", lambda r: r.error),
)


@dataclass
class FolderRuns:
    """The folder `--runs` named, and its table as the server made it at start-up."""

    folder: Path
    rows: list[RunRow]

    def openable(self) -> list[str]:
        """Files that opened and checked without error: the only names the page may ask for."""
        return [r.file for r in self.rows if r.error is None]

    def path_of(self, name: str | None) -> Path:
        if not name:
            raise SpecvizError("pick a run from the folder's table first")
        if name not in self.openable():  # a name from the table, never a path from the page
            raise SpecvizError(f"{name}: not a run of the listed folder")
        return self.folder / name


RUNS_LINK = "runs:"  # a link to a run of the listed folder: "runs:<file name>"
# The folder of `python app.py --runs DIR`, scanned once before the app is built (empty: no section).
FOLDER: list[FolderRuns] = []


def open_runs_folder(folder: str | Path, progress: bool | None = None) -> FolderRuns:
    """Scan `folder` (see `scan_runs`) for the page; refused in public mode. `progress`: a count
    of files on stderr (default: when stderr is a terminal)."""
    if serve.public_mode():
        raise SpecvizError(PUBLIC_RUNS_REFUSED)
    show = sys.stderr.isatty() if progress is None else progress

    def count(done: int, total: int) -> None:
        print(f"\rruns: {done}/{total} files checked", end="\n" if done == total else "", file=sys.stderr, flush=True)

    rows = scan_runs(folder, progress=count if show else None)
    FOLDER[:] = [FolderRuns(Path(folder), rows)]
    return FOLDER[0]


def load_listed(name: str | None) -> LoadedRun:
    """The run `name` of the listed folder, opened like `--trace` (never in public mode)."""
    if not FOLDER:
        raise SpecvizError("no folder is listed (start the app with --runs DIR)")
    loaded = load_local(FOLDER[0].path_of(name))
    loaded.link = f"{RUNS_LINK}{name}"  # the file's name in the listed folder, never its path
    return loaded


def table_rows(rows: list[RunRow]) -> list[list[Any]]:
    """The table's cells, "" where a value is unknown (the page shows nothing there)."""
    return [["" if (value := cell(r)) is None else value for _, cell in SHOWN] for r in rows]


@dataclass
class RunsSection:
    pick: Any
    open_a: Any
    open_b: Any
    table: Any

    @classmethod
    def build(cls, listed: FolderRuns) -> RunsSection:
        names = listed.openable()
        errors = sum(r.error is not None for r in listed.rows)
        title = f"Runs in {listed.folder.name or listed.folder} ({len(listed.rows)} files"
        title += f", {errors} unreadable)" if errors else ")"
        with gr.Accordion(title, open=True, elem_id="sv-runs"):
            gr.Markdown(
                "Every trace of the folder given with `--runs`, checked when the server started "
                "(`specviz runs DIR` prints the same table; `--json` has every column)."
            )
            table = gr.Dataframe(
                value=table_rows(listed.rows),
                headers=[head for head, _ in SHOWN],
                interactive=False,
                wrap=True,
                elem_id="sv-runs-table",
            )
            with gr.Row(elem_id="sv-runs-open"):
                pick = gr.Dropdown(names, value=names[0] if names else None, label="run", elem_id="sv-runs-pick")
                open_a = gr.Button("open in A", variant="secondary", elem_id="sv-runs-open-a")
                open_b = gr.Button("open in B", variant="secondary", elem_id="sv-runs-open-b")
        return cls(pick=pick, open_a=open_a, open_b=open_b, table=table)
