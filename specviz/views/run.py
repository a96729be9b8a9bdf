"""A trace plus what every view needs from it, computed once when the run is loaded, and the views
of a loaded run as the app shows them (a run slot may be empty, a step index may be out of range).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go

from specviz.analysis.check import check_trace
from specviz.analysis.fed_columns import ColumnarFedHistory
from specviz.analysis.report import Report, Violation
from specviz.analysis.slots import FedHistory, StepSlots, fed_history, step_slots
from specviz.trace.columnar_read import ParquetSteps
from specviz.trace.schema import StepRecord, Trace
from specviz.views.faults import fault_markdown
from specviz.views.grid import DEFAULT_WINDOW, NO_ROW, grid_figure, legend_html
from specviz.views.grid_text import row_choices, row_details_markdown, step_markdown
from specviz.views.outputs import RunOutputs, outputs_html
from specviz.views.safe_text import html_text, md_text
from specviz.views.summary import compare_table, summary_markdown
from specviz.views.tokens import token_texts
from specviz.views.tree import is_tree_step, tree_figure

NO_ROW_PICKED = "Pick a row to see fed vs expected."
# A Parquet trace read lazily: the sequence x step heatmaps draw at most this many steps around
# the start step, and say so; the verdict, the timeline and the acceptance metrics (the check's
# sums) cover every step.
OVERVIEW_STEPS = 500
# A grid draws one page of a step's rows, never the whole batch: at most GRID_ROWS rows and about
# GRID_CELLS cells (rows x columns drawn; a wide window or query block gets fewer rows, never
# under MIN_GRID_ROWS). A 1,024-row step of 64 query slots drew 107,000 cells: 3 s and 32 MB a key.
GRID_ROWS = 32
GRID_CELLS = 4096
MIN_GRID_ROWS = 8


def rows_per_page(step: StepRecord, window: int | None = None) -> int:
    """How many rows one grid page of `step` draws with `window` cache slots shown."""
    columns = min(int(window or DEFAULT_WINDOW), step.cache_len) + step.query_len + 1
    return min(max(GRID_CELLS // max(columns, 1), MIN_GRID_ROWS), GRID_ROWS)


def row_page(step: StepRecord, row: int | None, per_page: int) -> tuple[int, int]:
    """[lo, hi) of the rows (indices in `step.rows`) on the page holding batch row `row`; the
    first page when the step lacks it. Pages are fixed, so j/k walks across them."""
    at = next((i for i, r in enumerate(step.rows) if r.row == row), 0) if row is not None else 0
    lo = at - at % per_page
    return lo, min(lo + per_page, len(step.rows))


def page_note(step: StepRecord, lo: int, hi: int) -> str:
    """ "showing rows N of M" when a page is not the whole step; empty otherwise."""
    if lo == 0 and hi == len(step.rows):
        return ""
    first, last = step.rows[lo].row, step.rows[hi - 1].row
    return (
        f"showing {hi - lo} of {len(step.rows)} rows (rows {first}..{last}): pick a row, or press j / k,"
        " to see the others"
    )


@dataclass
class LoadedRun:
    trace: Trace
    report: Report
    source: str  # bundled file name, upload name or "live run"
    history: FedHistory | ColumnarFedHistory  # columnar when the steps stay on disk (`lazy`)
    texts: dict[int, str]
    figures: dict[str, go.Figure] = field(default_factory=dict)  # whole-run figures, built on demand
    example: bool = False  # a bundled example trace, not the user's own run: the summary says so
    # What a link to this run names (a bundled trace's name, "--trace", "runs:<file>"); None: the
    # run cannot be named in a link (an upload or a live run lives only in its visitor's session).
    link: str | None = None
    # Which file a "--trace" link means: its name, so a link opened in an app started with another
    # file can say so (specviz.app.share). None for every other run.
    link_file: str | None = None
    report_file: str | None = None  # the app's report of this run, written once (specviz.app.share)
    _overview: tuple[Trace, str] | None = None

    @property
    def lazy(self) -> bool:
        """Whether the steps stay on disk (a Parquet trace opened, not read): a step reads one row group."""
        return isinstance(self.history, ColumnarFedHistory)

    @property
    def step_count(self) -> int:
        return len(self.trace.steps)

    def start_step_index(self) -> int:
        """Where a user should look first: the first violation's step, else the first step."""
        first = self.report.first_violation
        return first.step_index if first is not None else 0

    def step_slots(self, step_index: int, row: int | None = None, per_page: int = GRID_ROWS) -> StepSlots:
        """The slots of the page of rows holding batch row `row` (the first page when None)."""
        step = self.trace.steps[step_index]
        lo, hi = row_page(step, row, per_page)
        rows = step.rows[lo:hi]
        history = self.history
        if not isinstance(history, ColumnarFedHistory):
            return step_slots(self.trace, step_index, self.report, history, rows=rows)
        with history.lock:  # only what this step draws: its row group, its sequences' history
            seqs = {r.seq_id for r in rows}
            return step_slots(self.trace, step_index, self.report, history.before_step(seqs, step_index), rows=rows)

    def overview(self) -> tuple[Trace, str]:
        """The trace the whole-run views walk, and the note they show: every step of an eager run
        (no note); of a lazy one, at most OVERVIEW_STEPS steps around the start step, named."""
        if not self.lazy:
            return self.trace, ""
        with self.history.lock:
            return self._lazy_overview()

    def _lazy_overview(self) -> tuple[Trace, str]:
        if self._overview is None:
            n = self.step_count
            lo = min(max(self.start_step_index() - OVERVIEW_STEPS // 2, 0), max(n - OVERVIEW_STEPS, 0))
            hi = min(lo + OVERVIEW_STEPS, n)
            steps = self.trace.steps[lo:hi]
            part = Trace(header=self.trace.header, steps=steps, sequences=self.trace.sequences)
            note = "" if hi - lo == n else f"showing steps {lo}..{hi - 1} of {n} (indices; the rest stays on disk)"
            self._overview = (part, note)
        return self._overview

    def figure(self, key: str, build: Callable[[], go.Figure]) -> go.Figure:
        """A whole-run figure, built once per run: switching slots back and forth stays instant."""
        if key not in self.figures:
            self.figures[key] = build()
        return self.figures[key]


def analyse(trace: Trace, source: str) -> LoadedRun:
    """Check the trace and index it for the grid; the slow part of loading, done once.

    A trace whose steps are a `ParquetSteps` (`ParquetTrace.open()`) stays on disk: the check
    streams it, and the grid's history is read as columns on the first step drawn.
    """
    steps = trace.steps
    history = ColumnarFedHistory(steps.source) if isinstance(steps, ParquetSteps) else fed_history(trace)
    return LoadedRun(trace=trace, report=check_trace(trace), source=source, history=history, texts=token_texts(trace))


# ----------------------------------------------------------------------------- a slot's views


def empty_figure(message: str) -> go.Figure:
    """A blank figure that says why it is blank."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 14})
    fig.update_layout(height=160, xaxis={"visible": False}, yaxis={"visible": False}, plot_bgcolor="white")
    return fig


@dataclass
class GridView:
    """The grid tab for one step: the clamped step, the row picker, the figure and its texts."""

    step_index: int
    row: int  # the highlighted row, NO_ROW when none (or the step lacks the one asked for)
    row_choices: list[tuple[str, int]]
    figure: go.Figure
    step_text: str
    row_text: str
    legend: str = ""  # HTML under the plot: the kinds and marks this step shows
    tree: go.Figure | None = None  # tree verification (schema 3): each row's candidate tree; None: a chain


def grid_view(loaded: LoadedRun | None, step_index: int | None, row: int | None, window: int | None) -> GridView:
    if loaded is None or not loaded.trace.steps:
        message = "No run loaded in this slot." if loaded is None else "This trace records no steps."
        return GridView(0, NO_ROW, [("none", NO_ROW)], empty_figure(message), "", "")
    step_index = min(max(int(step_index or 0), 0), loaded.step_count - 1)
    step = loaded.trace.steps[step_index]
    window = int(window or DEFAULT_WINDOW)
    per_page = rows_per_page(step, window)
    slots = loaded.step_slots(step_index, None if row is None else int(row), per_page)
    row = int(row) if row is not None and slots.find_row(int(row)) is not None else NO_ROW
    lo, hi = row_page(step, row, per_page)
    note = page_note(step, lo, hi)
    figure = grid_figure(slots, loaded.texts, window=window, selected_row=row, note=note)
    row_text = row_details_markdown(slots, row, loaded.texts) if row != NO_ROW else NO_ROW_PICKED
    legend = where_html(loaded, step_index, row) + legend_html(slots, row if row != NO_ROW else None)
    tree = tree_figure(step, loaded.texts, row if row != NO_ROW else None) if is_tree_step(step) else None
    step_text = step_markdown(slots, step_violations(loaded.report, step_index)) + (f"\n\n*{note}*" if note else "")
    return GridView(step_index, row, row_choices(step), figure, step_text, row_text, legend, tree)


def step_violations(report: Report, step_index: int) -> list[Violation]:
    """Every violation of the step, on every row (the grid draws one page of them)."""
    return [v for v in report.violations if v.step_index == step_index]


def where_html(loaded: LoadedRun, step_index: int, row: int) -> str:
    """What the grid shows, for the page's script: the link to this cell and the keys start here."""
    link = html_text(loaded.link or "", 300)
    where = f"data-trace='{link}' data-step='{int(step_index)}' data-row='{int(row)}'"
    if loaded.link_file:
        where += f" data-run='{html_text(loaded.link_file, 200)}'"
    return f"<span class='sv-where' hidden {where}></span>"


def slot_summary_markdown(loaded: LoadedRun | None, label: str) -> str:
    if loaded is None:
        return f"### Run {label}: empty\nLoad a bundled trace, upload a trace file, or start a live run."
    fault = fault_markdown(loaded.trace.header.fault)  # what the injected bug does, where it is named
    # Small print under the verdict (the run's settings, its source, what the fault does): the
    # header stays short, so the grid is on the first screen.
    # A bundled example beside the user's own run must not read as theirs.
    text = summary_markdown(loaded.trace, loaded.report, f"{label} (bundled example)" if loaded.example else label)
    text = text.removesuffix("</sub>") + f" · source: <span class='sv-nowrap'>{md_text(loaded.source)}</span></sub>"
    return text + (f"\n\n<sub>{fault}</sub>" if fault else "")


def slot_outputs_html(loaded: LoadedRun | None, other: LoadedRun | None, label: str, page: int, only: bool) -> str:
    """The outputs of slot `label` (page counts from 1), beside the other slot's when it has a run."""
    if loaded is None:
        return "<div class='sv-note'>No run loaded in this slot.</div>"
    other_label = "B" if label == "A" else "A"
    main = RunOutputs(label, loaded.trace, loaded.report, loaded.texts)  # the table read at load, reused
    side = RunOutputs(other_label, other.trace, other.report, other.texts) if other is not None else None
    return outputs_html(main, side, page=int(page or 1) - 1, only_diverged=bool(only))


def slots_compare_table(run_a: LoadedRun | None, run_b: LoadedRun | None) -> pd.DataFrame:
    runs = [(label, r.trace, r.report) for label, r in (("A", run_a), ("B", run_b)) if r is not None]
    return compare_table(runs) if runs else pd.DataFrame()
