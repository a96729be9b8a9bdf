"""Sharing and moving like a trace viewer: the page's URL, the keys, a cell's details, the report.

- A link: `?slot=A&trace=NAME&step=I&row=R&tab=grid`. The page's script (assets.SHARE_JS) keeps
  the address bar on what the grid shows; opening the link restores it (`LinkState`, read when
  the page loads). A trace is named, never given as a path: a bundled trace's name, "--trace"
  (the file `python app.py --trace` opened; `run=FILE` names that file, so an app started with
  another file says so), "runs:<file>" (a run of `--runs DIR`'s table). An
  upload or a live run has no name a link could carry: its link opens the step and row only.
  In public mode only bundled names resolve (the other two are refused at start-up there).
- Keys: the script writes the key into a hidden box; `key_move` answers with the grid's new step
  and row. A cell's details: the script writes "row:col" (a click, a tap, Enter); `cell_details`
  answers with the panel.
- The report: the inspected run's finding as one HTML file (`specviz.views.report`).
"""

from __future__ import annotations

import contextlib
import os
import re
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specviz.analysis.report import Violation
from specviz.app.live import LIVE_FOLDER
from specviz.app.loading import LOCAL_A, LOCAL_CHOICE, bundled_traces, load_bundled
from specviz.app.runs_tab import FOLDER, RUNS_LINK, load_listed
from specviz.errors import SpecvizError
from specviz.trace.naming import run_slug
from specviz.views import LoadedRun
from specviz.views.details import cell_details_html, focus_col
from specviz.views.grid import DEFAULT_WINDOW, NO_ROW, drawn_columns
from specviz.views.report import report_html

TABS = ("grid", "invariants", "acceptance", "kv", "outputs", "compare")  # detail.build_detail_tabs' ids
# A link with a step but no trace came from an uploaded or live run: the page says what it shows.
UNNAMED_LINK = (
    "this link names no run (an uploaded or live run stays in its browser session): its step and row "
    "are shown on slot {slot}'s example; load the same trace file into slot {slot} to see them in yours"
)
FILE_NAME = re.compile(r"\w[\w .+-]{0,199}")  # a file's name (spaces too), never a folder
MAX_PARAM_CHARS = 300  # a query parameter is a name or a number: anything longer is not ours
LINK_NUMBER = re.compile(r"[0-9]{1,9}", re.ASCII)  # a step or row the page writes: no sign, no Unicode digit


@dataclass
class LinkState:
    """What a link asks the page to open; every field checked, none trusted. A value that is not
    one this page makes (a sign, a Unicode digit, a huge number, an empty or repeated key with two
    values) is ignored and named in `ignored`: the page opens its runs and says which it ignored."""

    slot: str = "A"
    trace: str | None = None
    step: int | None = None
    row: int | None = None
    tab: str | None = None
    run: str | None = None  # with trace "--trace": the name of the file the link's app had opened
    ignored: tuple[str, ...] = ()

    @classmethod
    def from_params(cls, params: Any) -> LinkState:
        """From the URL's query parameters (a mapping or a multi-mapping); never raises."""
        ignored: list[str] = []

        def get(name: str) -> str | None:
            values = _param_values(params, name)
            if not values:
                return None
            value = values[0]
            if len(set(values)) > 1 or not isinstance(value, str) or not 0 < len(value) <= MAX_PARAM_CHARS:
                ignored.append(name)
                return None
            return value

        def number(name: str) -> int | None:
            value = get(name)
            if value is None:
                return None
            # ASCII digits only: "²".isdigit() is true and int("²") raises; int("٣") is 3; "--1".
            if LINK_NUMBER.fullmatch(value) is None:
                ignored.append(name)
                return None
            return int(value)

        slot = get("slot")
        if slot is not None and slot.upper() not in ("A", "B"):
            ignored.append("slot")
        tab = get("tab")
        if tab is not None and tab not in TABS:
            ignored.append("tab")
        return cls(
            slot="B" if (slot or "").upper() == "B" else "A",
            trace=get("trace"),
            step=number("step"),
            row=number("row"),
            tab=tab if tab in TABS else None,
            run=_file_name(get("run")),
            ignored=tuple(dict.fromkeys(ignored)),
        )

    @property
    def empty(self) -> bool:
        return self.trace is None and self.step is None and self.row is None and self.tab is None

    def ignored_note(self) -> str:
        """The status line for the parameters this link carried that the page ignored; "" if none."""
        if not self.ignored:
            return ""
        return f"this link's {', '.join(self.ignored)} ignored: not a value this page writes (opened without it)"


def _param_values(params: Any, name: str) -> list[Any]:
    """Every value of `name` in `params` (a repeated key has several); [] when absent or unreadable."""
    if params is None:
        return []
    try:
        many = getattr(params, "getlist", None)
        values = list(many(name)) if callable(many) else [params.get(name)]
    except Exception:  # noqa: BLE001 - a link never breaks the page, whatever its parameters are
        return []
    return [v for v in values if v is not None]


def _file_name(value: str | None) -> str | None:
    """A file's name as a link carries it: no folder, nothing but name characters."""
    return value if value is not None and FILE_NAME.fullmatch(value) else None


def load_linked(name: str) -> LoadedRun:
    """The run a link names: a bundled trace, the `--trace` file, or a run of the `--runs` table."""
    if name == LOCAL_CHOICE:
        if not LOCAL_A:
            raise SpecvizError("the link names the file its app was started with (--trace); this app opened none")
        return LOCAL_A[0]
    if name.startswith(RUNS_LINK):
        if not FOLDER:
            raise SpecvizError("the link names a run of a listed folder (--runs); this app lists none")
        return load_listed(name[len(RUNS_LINK) :])
    if name not in bundled_traces():
        raise SpecvizError(f"the link names {name!r}: not a trace this app can open (uploads are not shared)")
    return load_bundled(name)


def other_file_note(link: LinkState, loaded: LoadedRun) -> str:
    """What to say when a `--trace` link names another file than the one this app opened ("": the
    same file, or a link too old to name one)."""
    if link.trace != LOCAL_CHOICE or link.run is None or loaded.link_file in (None, link.run):
        return ""
    return (
        f"this link names the --trace file {link.run}; this app was started with --trace {loaded.link_file}: "
        f"shown is {loaded.link_file}, not the run the link was copied from"
    )


def landing_note(link: LinkState, step_count: int, shown_step: int, shown_row: int) -> str:
    """What to say when a link's step or row is not in its run ("": the page shows them)."""
    notes = []
    if link.step is not None and link.step != shown_step:
        notes.append(
            f"the link's step {link.step} is not in this run, whose last step is {step_count - 1}: "
            f"showing step {shown_step}"
        )
    if link.row is not None and link.row != shown_row:
        notes.append(f"row {link.row} is not in step {shown_step}: no row is selected")
    return "; ".join(notes)


# ----------------------------------------------------------------------------- keys


def _violation_after(violations: list[Violation], step: int, row: int, forward: bool) -> Violation | None:
    """The next (or previous) violation in the report's order after (step, row), each place once."""
    here = (step, row)
    places = [v for v in violations if v.step_index >= 0]
    if forward:
        return next((v for v in places if (v.step_index, v.row) > here), None)
    return next((v for v in reversed(places) if (v.step_index, v.row) < here), None)


def key_target(loaded: LoadedRun, key: str, step: int, row: int) -> tuple[int, int] | None:
    """(step, row) the grid moves to for `key`; None when it has nowhere to go (the grid stays)."""
    last = max(loaded.step_count - 1, 0)
    if key in (".", ","):
        target = min(max(step + (1 if key == "." else -1), 0), last)
        return (target, row) if target != step else None
    if key in ("n", "N"):
        found = _violation_after(loaded.report.violations, step, row, forward=key == "n")
        return (found.step_index, found.row) if found is not None else None
    if key in ("j", "k"):
        rows = [r.row for r in loaded.trace.steps[step].rows]  # every row: the grid pages with them
        if not rows:
            return None
        if row not in rows:
            return step, rows[0] if key == "j" else rows[-1]
        i = rows.index(row) + (1 if key == "j" else -1)
        return (step, rows[i]) if 0 <= i < len(rows) else None
    return None


def parse_pick(value: str | None) -> tuple[str, list[int]]:
    """ "<what>:<n>:<n>...:<nonce>" as the script writes it -> (what, numbers); ("", []) if malformed."""
    parts = (value or "").split(":")[:-1]  # the last part is a nonce: the same key twice fires twice
    if not parts or len(value or "") > 80:
        return "", []
    numbers = [int(p) for p in parts[1:] if p.lstrip("-").isdigit()]
    return parts[0], numbers


def cell_details(loaded: LoadedRun | None, step: int, row: int, col: int | None, window: int = DEFAULT_WINDOW) -> str:
    """The details panel of (row, col) at `step`, a cell the grid draws at `window`; col None: the
    row's first differing cell in view. A column left of the window (the panel following the grid
    to a later step, whose window moved right) is its first drawn one."""
    if loaded is None or not loaded.trace.steps:
        return ""
    step = min(max(int(step), 0), loaded.step_count - 1)
    grid = loaded.step_slots(step, row)  # the page of rows holding `row`: a panel costs one page
    if row == NO_ROW or grid.find_row(row) is None:
        if not grid.rows:
            return ""
        row = grid.rows[0].row
    drawn = drawn_columns(grid, int(window or DEFAULT_WINDOW))
    col = focus_col(grid.find_row(row), grid, drawn) if col is None else max(col, drawn.start)
    return cell_details_html(grid, row, col, loaded.texts)


def write_report(loaded: LoadedRun | None) -> str:
    """The run's report as a file in the app's live folder (pruned by age); its path. One file per
    run while it lasts: a button pressed again (or by every visitor of a bundled run) writes nothing."""
    if loaded is None:
        raise SpecvizError("no run in this slot: load one first")
    if loaded.report_file is not None and Path(loaded.report_file).is_file():
        return loaded.report_file
    # The method and fault come from the file: only safe characters reach a file name.
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", run_slug(loaded.trace.header.method, loaded.trace.header.fault))[:60]
    path = LIVE_FOLDER.new_file(f"finding-{name}.html")
    path.write_text(report_html(loaded, loaded.source), encoding="utf-8")
    loaded.report_file = str(path)
    if not getattr(loaded, "shared", False):  # a session's own run: its report goes when the run does
        weakref.finalize(loaded, remove_file, str(path))
    return loaded.report_file


def remove_file(path: str) -> None:
    """Delete a file the app wrote for one session; gone already is fine."""
    with contextlib.suppress(OSError):
        os.unlink(path)
