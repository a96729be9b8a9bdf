"""The detail tabs: one run inspected at a time, each tab a small dataclass of its components.

Each tab builds itself (`build`) and says what its components show for a loaded run (`show`) or for
an empty slot (`clear`), as `{component: value}`; `DetailUI` assembles the five tabs. Every value
comes from `specviz.views`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd
import plotly.graph_objects as go

from specviz.app.assets import RESIZE_PLOTS_JS
from specviz.app.run_slots import build_compare
from specviz.views import (
    GridView,
    LoadedRun,
    acceptance_figure,
    acceptance_heatmap,
    acceptance_markdown,
    drift_heatmap,
    empty_figure,
    grid_view,
    kv_heatmap,
    sequence_table,
    slot_outputs_html,
    timeline_figure,
    violations_table,
)
from specviz.views.grid import DEFAULT_WINDOW, NO_ROW
from specviz.views.outputs import PER_PAGE, page_count

GRID_TAB = "grid"  # the tab a jump to a violation opens
PLAY_SECONDS = 0.8


KEYS_HELP = """<div class='sv-keys-help' role='dialog' aria-label='keyboard shortcuts'>
<b>Keys</b> (not while typing in a field; ? shows or hides this list)
<table>
<tr><td><kbd>.</kbd> / <kbd>,</kbd></td><td>next / previous step</td></tr>
<tr><td><kbd>n</kbd> / <kbd>N</kbd></td><td>next / previous violation (its step and row)</td></tr>
<tr><td><kbd>j</kbd> / <kbd>k</kbd></td><td>highlight the row below / above</td></tr>
<tr><td><kbd>Enter</kbd></td><td>details of the highlighted row's first differing cell (or click a cell)</td></tr>
<tr><td><kbd>h</kbd> / <kbd>l</kbd></td><td>details of the cell to the left / right</td></tr>
<tr><td><kbd>Esc</kbd></td><td>close the details or this list</td></tr>
<tr><td><kbd>?</kbd></td><td>this list</td></tr>
</table></div>"""


@dataclass
class GridTools:
    """Beside the grid: a link to this cell, the finding as an HTML report, the keys, a cell's details.

    `cell` and `key` are hidden boxes the page's script writes into (assets.SHARE_JS): a click on a
    cell, a key pressed; the server answers in `details` or moves the grid.
    """

    copy_link: Any
    link: Any
    report: Any
    report_file: Any
    keys: Any
    keys_help: Any
    details: Any
    cell: Any
    key: Any

    @classmethod
    def build(cls) -> GridTools:
        with gr.Row(elem_id="sv-tools"):
            copy_link = gr.Button("copy link to this cell", size="md", min_width=60, elem_id="sv-copy-link")
            report = gr.Button("report (.html)", size="md", min_width=60, elem_id="sv-report")
            keys = gr.Button("keys (?)", size="md", min_width=60, elem_id="sv-keys")
        link = gr.Textbox(
            label="link to this cell", visible=False, interactive=False, elem_id="sv-link", buttons=["copy"]
        )
        report_file = gr.File(
            label="the finding as one HTML file", visible=False, interactive=False, elem_id="sv-report-file"
        )
        keys_help = gr.HTML(KEYS_HELP, elem_id="sv-keys-help", padding=False)
        details = gr.HTML(elem_id="sv-details", padding=False)
        cell = gr.Textbox(show_label=False, container=False, elem_id="sv-cell-pick", elem_classes=["sv-hidden-box"])
        key = gr.Textbox(show_label=False, container=False, elem_id="sv-key", elem_classes=["sv-hidden-box"])
        return cls(
            copy_link=copy_link, link=link, report=report, report_file=report_file, keys=keys,
            keys_help=keys_help, details=details, cell=cell, key=key,
        )  # fmt: skip


@dataclass
class GridTab:
    """Ragged grid: one verify step, the controls that move through steps, the highlighted row."""

    step: Any
    row: Any
    window: Any
    prev: Any
    next: Any
    play: Any
    pause: Any
    first: Any
    timer: Any
    figure: Any
    step_text: Any
    row_text: Any
    legend: Any
    tree: Any  # tree verification: each row's candidate tree, beside the grid (hidden for chains)
    tools: GridTools | None = None  # the shareable parts: link, report, keys, the cell's details

    @classmethod
    def build(cls) -> GridTab:
        # One row of controls above the grid (the step and how to move it), the rest under it: the
        # grid stays on the first screen (issue 25).
        with gr.Row(equal_height=True):
            step = gr.Slider(0, 1, value=0, step=1, label="step", scale=3, min_width=220, elem_id="sv-step")
            with gr.Column(scale=2, min_width=280):
                with gr.Row():
                    prev = gr.Button("◀ previous step", size="sm", min_width=60)
                    nxt = gr.Button("next step ▶", size="sm", min_width=60)
                    play = gr.Button("play ▶", size="sm", min_width=60)
                    pause = gr.Button("pause", size="sm", min_width=60)
                first = gr.Button("jump to first violation", size="sm", variant="primary", elem_id="sv-first")
        timer = gr.Timer(PLAY_SECONDS, active=False)
        figure = gr.Plot(show_label=False, elem_id="sv-grid")
        legend = gr.HTML(elem_id="sv-grid-legend", padding=False)
        tree = gr.Plot(show_label=False, elem_id="sv-tree", visible=False)
        tools = GridTools.build()
        with gr.Row():
            row = gr.Dropdown([("none", NO_ROW)], value=NO_ROW, label="highlight row", scale=1, elem_id="sv-row")
            window = gr.Slider(8, 512, value=DEFAULT_WINDOW, step=8, label="cache slots shown", scale=2)
        step_text = gr.Markdown(elem_id="sv-step-text")
        row_text = gr.Markdown(elem_id="sv-row-text")
        return cls(
            step=step, row=row, window=window, prev=prev, next=nxt, play=play, pause=pause, first=first,
            timer=timer, figure=figure, step_text=step_text, row_text=row_text, legend=legend, tree=tree, tools=tools,
        )  # fmt: skip

    def view_components(self) -> list[Any]:
        """What one drawn step sets (`view_values`)."""
        # The legend came later than the others: last, so API clients' positions stay as they were.
        return [self.row, self.figure, self.step_text, self.row_text, self.legend, self.tree]

    def view_values(self, view: GridView) -> dict[Any, Any]:
        return {
            self.row: gr.update(choices=view.row_choices, value=view.row),
            self.figure: view.figure,
            self.step_text: view.step_text,
            self.row_text: view.row_text,
            self.legend: view.legend,
            self.tree: gr.update(value=view.tree, visible=view.tree is not None),
        }

    def components(self) -> list[Any]:
        """What `show` sets, less the legend (`DetailUI.components` puts it last)."""
        return [self.step, self.first, self.row, self.figure, self.step_text, self.row_text]

    def show(self, loaded: LoadedRun, window: int) -> dict[Any, Any]:
        """Open on the run's first violation (its step and row), or its first step."""
        first = loaded.report.first_violation
        start = loaded.start_step_index()
        return {
            self.step: gr.update(minimum=0, maximum=max(loaded.step_count - 1, 1), value=start),
            self.first: gr.update(variant="primary" if first else "secondary"),  # nothing to jump to on a clean run
            **self.view_values(grid_view(loaded, start, first.row if first else NO_ROW, window)),
        }

    def clear(self, window: int) -> dict[Any, Any]:
        return {
            self.step: gr.update(minimum=0, maximum=1, value=0),
            self.first: gr.update(variant="secondary"),
            **self.view_values(grid_view(None, 0, NO_ROW, window)),
        }


@dataclass
class InvariantsTab:
    """The violations by step and invariant, and their table; a click on either opens one in the grid."""

    timeline: Any
    pick: Any  # a click on a timeline marker lands here (see assets.TIMELINE_CLICK_JS)
    violations: Any

    @classmethod
    def build(cls) -> InvariantsTab:
        timeline = gr.Plot(label="invariant timeline (click a marker to open it)", elem_id="sv-timeline")
        pick = gr.Textbox(show_label=False, container=False, elem_id="sv-timeline-pick")
        violations = gr.Dataframe(
            label="violations: click one to open its step and row in the grid",
            interactive=False,
            wrap=True,
            # The message says what broke: it gets the room (and wraps), the numbers get little.
            column_widths=["5%", "5%", "5%", "13%", "10%", "14%", "14%", "34%"],
            elem_id="sv-violations",
        )
        return cls(timeline=timeline, pick=pick, violations=violations)

    def components(self) -> list[Any]:
        return [self.timeline, self.violations]

    def show(self, loaded: LoadedRun) -> dict[Any, Any]:
        trace, report = loaded.trace, loaded.report
        return {
            self.timeline: loaded.figure("timeline", lambda: timeline_figure(trace, report)),
            self.violations: violations_table(report),
        }

    def clear(self, empty: go.Figure) -> dict[Any, Any]:
        return {self.timeline: empty, self.violations: pd.DataFrame()}


def noted(fig: go.Figure, note: str) -> go.Figure:
    """`fig` with `note` (which steps it shows, when not all) as a line under its title."""
    if note:
        title = fig.layout.title.text or ""
        fig.update_layout(title={"text": f"{title}<br><sup>{note}</sup>"})
    return fig


@dataclass
class AcceptanceTab:
    """Acceptance metrics, the sequence x step heatmap of accepted drafts, the per-sequence table."""

    text: Any
    figure: Any
    heatmap: Any
    sequences: Any

    @classmethod
    def build(cls) -> AcceptanceTab:
        text = gr.Markdown(elem_id="sv-acceptance-text")
        figure = gr.Plot(label="acceptance metrics", elem_id="sv-acceptance")
        heatmap = gr.Plot(label="acceptance heatmap", elem_id="sv-acceptance-map")
        sequences = gr.Dataframe(label="per sequence", interactive=False, elem_id="sv-sequences")
        return cls(text=text, figure=figure, heatmap=heatmap, sequences=sequences)

    def components(self) -> list[Any]:
        return [self.text, self.figure, self.heatmap, self.sequences]

    def show(self, loaded: LoadedRun) -> dict[Any, Any]:
        trace, report = loaded.trace, loaded.report
        # The metrics from the sums the check gathered in its one walk over every step (a lazy
        # run's steps stay on disk; an eager run's would be walked once per view, ~0.1 s each at
        # the public budget); the sequence x step heatmap over the steps around the start step, named.
        totals = report.totals
        part, note = loaded.overview()
        return {
            self.text: acceptance_markdown(trace, totals),
            self.figure: loaded.figure("acceptance", lambda: acceptance_figure(trace, totals)),
            self.heatmap: loaded.figure("acceptance_heatmap", lambda: noted(acceptance_heatmap(part), note)),
            self.sequences: sequence_table(trace, report, totals),
        }

    def clear(self, empty: go.Figure) -> dict[Any, Any]:
        return {self.text: "", self.figure: empty, self.heatmap: empty, self.sequences: pd.DataFrame()}


@dataclass
class KvTab:
    """KV length error and position-ID drift, sequence x step."""

    kv: Any
    drift: Any

    @classmethod
    def build(cls) -> KvTab:
        kv = gr.Plot(label="KV length error", elem_id="sv-kv")
        drift = gr.Plot(label="position-ID drift", elem_id="sv-drift")
        return cls(kv=kv, drift=drift)

    def components(self) -> list[Any]:
        return [self.kv, self.drift]

    def show(self, loaded: LoadedRun) -> dict[Any, Any]:
        trace, note = loaded.overview()
        return {
            self.kv: loaded.figure("kv", lambda: noted(kv_heatmap(trace), note)),
            self.drift: loaded.figure("drift", lambda: noted(drift_heatmap(trace), note)),
        }

    def clear(self, empty: go.Figure) -> dict[Any, Any]:
        return {self.kv: empty, self.drift: empty}


@dataclass
class OutputsTab:
    """Per sequence, divergent first: reference, the inspected run, the other slot's run; paged."""

    page: Any
    only_diverged: Any
    cards: Any

    @classmethod
    def build(cls) -> OutputsTab:
        with gr.Row():
            page = gr.Number(value=1, minimum=1, maximum=1, precision=0, label="page", scale=1, elem_id="sv-page")
            only_diverged = gr.Checkbox(value=False, label="only divergent sequences", scale=2)
        cards = gr.HTML(elem_id="sv-outputs")
        return cls(page=page, only_diverged=only_diverged, cards=cards)

    def components(self) -> list[Any]:
        return [self.page, self.cards]

    def show(self, loaded: LoadedRun, other: LoadedRun | None, label: str, only: bool) -> dict[Any, Any]:
        return {
            self.page: gr.update(value=1, maximum=page_count(loaded.report, PER_PAGE, only)),
            self.cards: slot_outputs_html(loaded, other, label, 1, only),
        }

    def clear(self, label: str, only: bool) -> dict[Any, Any]:
        return {self.page: gr.update(value=1, maximum=1), self.cards: slot_outputs_html(None, None, label, 1, only)}


@dataclass
class DetailUI:
    """The five detail tabs, each by name; `details` says what all of them show for one run."""

    tabs: Any
    grid: GridTab
    invariants: InvariantsTab
    acceptance: AcceptanceTab
    kv: KvTab
    outputs: OutputsTab
    compare: Any = None  # the A vs B table, in its own tab; set by the slots' events, not by `details`

    def components(self) -> list[Any]:
        """Everything `details` sets. A list, not a set: the API returns values in this order."""
        parts = (self.grid, self.invariants, self.acceptance, self.kv, self.outputs)
        # Outputs added after the API was published go at the end: clients read by position.
        return [component for part in parts for component in part.components()] + [self.grid.legend, self.grid.tree]

    def details(self, loaded: LoadedRun | None, other: LoadedRun | None, label: str, window: int, only: bool) -> dict:
        """Every detail output for the inspected run, opening on its first violation."""
        if loaded is None:
            empty = empty_figure(f"Run {label} is empty: load a trace into slot {label}.")
            return {
                **self.grid.clear(window),
                **self.invariants.clear(empty),
                **self.acceptance.clear(empty),
                **self.kv.clear(empty),
                **self.outputs.clear(label, only),
            }
        return {
            **self.grid.show(loaded, window),
            **self.invariants.show(loaded),
            **self.acceptance.show(loaded),
            **self.kv.show(loaded),
            **self.outputs.show(loaded, other, label, only),
        }


def build_detail_tabs() -> DetailUI:
    with gr.Tabs() as tabs:
        with gr.Tab("Ragged grid", id=GRID_TAB) as grid_tab:
            grid = GridTab.build()
        with gr.Tab("Invariants", id="invariants") as invariants_tab:
            invariants = InvariantsTab.build()
        with gr.Tab("Acceptance", id="acceptance") as acceptance_tab:
            acceptance = AcceptanceTab.build()
        with gr.Tab("KV & positions", id="kv") as kv_tab:
            kv = KvTab.build()
        with gr.Tab("Outputs", id="outputs") as outputs_tab:
            outputs = OutputsTab.build()
        with gr.Tab("A vs B", id="compare") as compare_tab:
            compare = build_compare()
    for tab in (grid_tab, invariants_tab, acceptance_tab, kv_tab, outputs_tab, compare_tab):
        tab.select(None, None, None, js=RESIZE_PLOTS_JS, queue=False, show_progress="hidden", api_visibility="private")
    return DetailUI(
        tabs=tabs, grid=grid, invariants=invariants, acceptance=acceptance, kv=kv, outputs=outputs, compare=compare
    )
