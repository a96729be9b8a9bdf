"""The page opening: the default pair of examples, inspecting A, or what the page's link names
(`specviz.app.share`): its run, step, row and tab, and a line wherever that is not what it asked."""

from __future__ import annotations

from typing import Any

import gradio as gr

from specviz.app import serve, share
from specviz.app.assets import PAGE_JS
from specviz.app.detail import DetailUI
from specviz.app.handlers import pick, status_update
from specviz.app.loading import DEFAULT_A, DEFAULT_B, LOCAL_A, LOCAL_CHOICE, bundled_traces, load_default
from specviz.app.run_slots import RunSlot
from specviz.errors import SpecvizError
from specviz.trace.io import TraceError
from specviz.views import LoadedRun, grid_view, slot_summary_markdown, slots_compare_table


def wire_preload(demo: gr.Blocks, slot_a: RunSlot, slot_b: RunSlot, inspect: Any, compare: Any, ui: DetailUI) -> None:
    def preload(window: int, only: bool, request: gr.Request | None = None) -> dict:
        """Open on the default pair of examples, inspecting A, or on what the page's link names
        (`specviz.app.share`); a missing bundle leaves the slot empty."""
        link = share.LinkState.from_params(getattr(request, "query_params", None))
        runs = {
            "A": LOCAL_A[0] if LOCAL_A else load_default(DEFAULT_A),  # `python app.py --trace PATH`
            "B": load_default(DEFAULT_B),
        }
        message, opened = "", False  # opened: the run the link names is in its slot
        if link.trace is None and link.step is not None:  # an upload's or a live run's link
            message = share.UNNAMED_LINK.format(slot=link.slot)
        if link.trace is not None:
            try:
                runs[link.slot] = share.load_linked(link.trace)
                message, opened = share.other_file_note(link, runs[link.slot]), True
            except (SpecvizError, TraceError, OSError) as exc:  # an old or foreign link: say so, open the rest
                message = serve.without_paths(str(exc))
        label = link.slot
        loaded, other = pick(label, runs["A"], runs["B"])
        cell: dict = {}
        if loaded is not None and (link.step is not None or link.row is not None):
            cell, missed = _linked_cell(loaded, link, window, ui)
            message = "; ".join(m for m in (message, missed) if m)  # never a silent move to another cell
        message = "; ".join(m for m in (link.ignored_note(), message) if m)  # a malformed value: ignored, said
        values = {
            slot_a.state: runs["A"],
            slot_b.state: runs["B"],
            slot_a.summary: slot_summary_markdown(runs["A"], "A"),
            slot_b.summary: slot_summary_markdown(runs["B"], "B"),
            compare: slots_compare_table(runs["A"], runs["B"]),
            inspect: label,
            (slot_a if label == "A" else slot_b).status: status_update(message),
            **ui.details(loaded, other, label, window, only),
        }
        if opened:  # the picker names the linked run when it is one of its own
            picked = link.trace if link.trace in bundled_traces() or link.trace == LOCAL_CHOICE else None
            values[(slot_a if label == "A" else slot_b).bundled] = gr.update(value=picked)
        values.update(cell)
        if link.tab is not None:
            values[ui.tabs] = gr.Tabs(selected=link.tab)
        return values

    demo.load(None, js=PAGE_JS, api_visibility="private")
    demo.load(
        preload,
        [ui.grid.window, ui.outputs.only_diverged],
        [
            slot_a.state, slot_b.state, slot_a.summary, slot_b.summary, compare, *ui.components(),
            inspect, ui.tabs, slot_a.bundled, slot_b.bundled, slot_a.status, slot_b.status,
        ],
        api_visibility="private",
    )  # fmt: skip


def _linked_cell(loaded: LoadedRun, link: share.LinkState, window: int, ui: DetailUI) -> tuple[dict, str]:
    """The grid at the link's step and row (clamped to the run; a row the step lacks is none), and
    what the page says when that is not what the link asked for."""
    grid = ui.grid
    step = link.step if link.step is not None else loaded.start_step_index()
    view = grid_view(loaded, step, link.row, window)
    top = max(loaded.step_count - 1, 1)
    values = {grid.step: gr.update(minimum=0, maximum=top, value=view.step_index), **grid.view_values(view)}
    return values, share.landing_note(link, loaded.step_count, view.step_index, view.row)
