"""The app's events: what each control does, as handlers returning `{component: value}` dicts.

A dict cannot put a value in the wrong output; the outputs are still bound as lists, because the
API returns values in that order. Handlers never raise to Gradio: a failure is a one-line status
in the slot (`user_errors`), and the slot keeps its run.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from specviz.app import serve, share
from specviz.app.assets import COPY_LINK_JS, RESIZE_PLOTS_JS, TOGGLE_KEYS_JS
from specviz.app.detail import GRID_TAB, DetailUI
from specviz.app.handlers import inspected, last_step, pick, status_update, user_errors
from specviz.app.live import LIVE_GATE, PUBLIC, LiveRequest, live_run, save_for_download, whole
from specviz.app.loading import (
    load_bundled,
    load_upload,
)
from specviz.app.page_open import wire_preload
from specviz.app.run_slots import RunSlot
from specviz.app.runs_tab import FOLDER, RunsSection, load_listed
from specviz.errors import SpecvizError
from specviz.views import LoadedRun, grid_view, slot_outputs_html, slot_summary_markdown, slots_compare_table
from specviz.views.grid import NO_ROW

REFUSED = "live run not started: one of yours is already queued or running, or too many are waiting; try again after it"


# ----------------------------------------------------------------------------- wiring


def wire(demo: gr.Blocks, slot_a: RunSlot, slot_b: RunSlot, inspect: Any, compare: Any, ui: DetailUI) -> None:
    """Bind every event of the page (in this order: Gradio numbers the events as they are bound)."""
    for slot, other in ((slot_a, slot_b), (slot_b, slot_a)):
        wire_slot(slot, other, inspect, compare, ui)
    states = [slot_a.state, slot_b.state]
    wire_inspect(inspect, states, ui)
    wire_navigation(inspect, states, ui)
    wire_outputs_page(inspect, states, ui)
    wire_preload(demo, slot_a, slot_b, inspect, compare, ui)
    wire_share(inspect, states, ui)


def wire_inspect(inspect: Any, states: list[Any], ui: DetailUI) -> None:
    """The inspect switch redraws every tab; step, row and window redraw the grid."""
    grid = ui.grid

    def on_inspect(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None, window: int, only: bool) -> dict:
        loaded, other = pick(label, run_a, run_b)
        return ui.details(loaded, other, label, window, only)

    # input, not change: every handler that sets the switch (a run landing, a link) draws the
    # details itself; a change event would redraw them at the run's start, over a link's cell.
    inspect.input(
        on_inspect, [inspect, *states, grid.window, ui.outputs.only_diverged], ui.components(), api_name="inspect"
    )

    def on_grid(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None, step: int, row: int, window: int):
        return grid.view_values(grid_view(inspected(label, run_a, run_b), step, row, window))

    gr.on(
        [grid.step.change, grid.row.input, grid.window.release],
        on_grid,
        [inspect, *states, grid.step, grid.row, grid.window],
        grid.view_components(),
        api_name="grid",
        trigger_mode="always_last",  # dragging the slider: draw the step it rests on, not every one passed
    )


def wire_outputs_page(inspect: Any, states: list[Any], ui: DetailUI) -> None:
    tab = ui.outputs

    def on_page(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None, page: int, only: bool) -> dict:
        loaded, other = pick(label, run_a, run_b)
        return {tab.cards: slot_outputs_html(loaded, other, label, page, only)}

    gr.on(
        [tab.page.change, tab.only_diverged.change],
        on_page,
        [inspect, *states, tab.page, tab.only_diverged],
        [tab.cards],
        api_visibility="private",
    )


def _landing(slot: RunSlot, other: RunSlot, inspect: Any, compare: Any, ui: DetailUI) -> Any:
    """The handler's answer when a run lands in `slot` (see `wire_slot` for the outputs it sets)."""
    a_first = slot.label == "A"

    def finish(loaded: LoadedRun, other_run: LoadedRun | None, window: int, only: bool, bundled: bool) -> dict:
        """A run lands in this slot: show it, inspect it, compare it with the other slot's."""
        run_a, run_b = (loaded, other_run) if a_first else (other_run, loaded)
        return {
            slot.state: loaded,
            slot.summary: slot_summary_markdown(loaded, slot.label),
            slot.status: status_update(),  # the last failure is history once a run lands
            other.status: status_update(),  # in either slot: an old error line would read as this run's
            # An uploaded or live run is no bundled example: the picker must not name the old one.
            **({} if bundled else {slot.bundled: gr.update(value=None)}),
            inspect: slot.label,
            compare: slots_compare_table(run_a, run_b),
            **ui.details(loaded, other_run, slot.label, window, only),
        }

    return finish


def _landing_outputs(slot: RunSlot, other: RunSlot, inspect: Any, compare: Any, ui: DetailUI) -> list[Any]:
    """What a run landing in `slot` sets, in the API's order."""
    # `other.status` came later: last, so API clients' positions of the rest stay as they were.
    return [slot.state, slot.summary, slot.status, slot.bundled, inspect, compare, *ui.components(), other.status]


def wire_slot(slot: RunSlot, other: RunSlot, inspect: Any, compare: Any, ui: DetailUI) -> None:
    """A bundled pick, an upload or a live run lands in `slot`: shown, inspected, compared."""
    label = slot.label.lower()
    outputs = _landing_outputs(slot, other, inspect, compare, ui)
    finish = _landing(slot, other, inspect, compare, ui)

    @user_errors(slot.status)
    def from_bundle(name: str, other_run: LoadedRun | None, window: int, only: bool) -> dict:
        return finish(load_bundled(name), other_run, window, only, bundled=True)

    def from_picker(name: str, own: LoadedRun | None, other_run: LoadedRun | None, window: int, only: bool) -> Any:
        # Focus and blur fire the picker's input event with the value it shows: the run the slot
        # already holds (or none, after an upload). That is no pick: the slot keeps its run and view.
        if not name or (own is not None and own.link == name):
            return gr.skip()
        return from_bundle(name, other_run, window, only)

    @user_errors(slot.status)
    def from_upload(
        path: str | None, other_run: LoadedRun | None, window: int, only: bool, request: gr.Request
    ) -> dict:
        # Only this session's own upload is read (specviz.app.uploads): any other path is "gone".
        session = getattr(request, "session_hash", None)
        return finish(load_upload(path, session), other_run, window, only, bundled=False)

    @user_errors(slot.status)
    def from_live(
        method: str,
        fault: str,
        batch_size: float,
        draft_k: float,
        max_new_tokens: float,
        num_prompts: float,
        prompts: str,
        target: str,
        draft: str,
        other_run: LoadedRun | None,
        window: int,
        only: bool,
        proposer: str,
        tree_branches: float,
        tree_kind: str,
        request: gr.Request,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 - how Gradio injects progress
    ) -> dict:
        try:
            sizes = [whole(v) for v in (batch_size, draft_k, max_new_tokens, num_prompts)]
            drafting = (proposer, whole(tree_branches), tree_kind)
            asked = LiveRequest(method, fault, *sizes, prompts, target, draft, *drafting)
            loaded = live_run(asked, progress, PUBLIC)
            download = gr.update(value=save_for_download(loaded), visible=True)
            return {**finish(loaded, other_run, window, only, bundled=False), slot.download: download}
        finally:
            LIVE_GATE.done(getattr(request, "session_hash", None))

    common = [other.state, ui.grid.window, ui.outputs.only_diverged]
    # input, not select: a pick from the keyboard (type, arrow, Enter) fires input only. The API
    # endpoint has its own hidden trigger, so its arguments and answers stay as they were.
    slot.bundled.input(from_picker, [slot.bundled, slot.state, *common], outputs, api_visibility="private")
    slot.api_trigger.click(from_bundle, [slot.bundled, *common], outputs, api_name=f"load_bundled_{label}")
    slot.upload.upload(from_upload, [slot.upload, *common], outputs, api_name=f"load_upload_{label}")
    slot.run_button.click(
        from_live,
        [*slot.live_inputs, *common, *slot.drafting_inputs],
        [*outputs, slot.download],
        api_name=f"live_run_{label}",
        show_progress_on=[slot.summary],  # one progress bar per run, under the button that started it
        concurrency_limit=1,
        concurrency_id=serve.LIVE_CONCURRENCY_ID,  # one live run at a time across both slots: it takes the CPU
    ).failure(
        # Handlers never fail, so a failure is the gate refusing the run before it queued: Gradio
        # has then put its red "Error" badge on the summary. Redrawing the summary clears it; the
        # status line says why (the toast said it too, and goes).
        lambda run: {slot.summary: slot_summary_markdown(run, slot.label), slot.status: status_update(REFUSED)},
        [slot.state],
        [slot.summary, slot.status],
        show_progress="hidden",
        api_visibility="private",
    )


def wire_runs(section: RunsSection, slot_a: RunSlot, slot_b: RunSlot, inspect: Any, compare: Any, ui: DetailUI) -> None:
    """`--runs DIR`: a run picked from the folder's table lands in A or B like an upload; a click
    on a table row picks its run."""
    for slot, other, button in ((slot_a, slot_b, section.open_a), (slot_b, slot_a, section.open_b)):
        finish = _landing(slot, other, inspect, compare, ui)

        @user_errors(slot.status)
        def from_folder(name: str, other_run: LoadedRun | None, window: int, only: bool, finish: Any = finish) -> dict:
            return finish(load_listed(name), other_run, window, only, bundled=False)

        inputs = [section.pick, other.state, ui.grid.window, ui.outputs.only_diverged]
        outputs = _landing_outputs(slot, other, inspect, compare, ui)
        button.click(from_folder, inputs, outputs, api_name=f"open_listed_{slot.label.lower()}")

    def pick_row(evt: gr.SelectData) -> Any:
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        rows = FOLDER[0].rows if FOLDER else []
        if not isinstance(row, int) or not 0 <= row < len(rows) or rows[row].error is not None:
            return gr.skip()  # an unreadable file has nothing to open: the pick stays
        return rows[row].file

    # "multiple": a row clicked while the last click is in flight is the reader's pick. The default
    # "once" drops that click, and Gradio 6.31's "always_last" reruns with the first click's row.
    # The queue runs a listener's events in order, so the last click's row is what stays.
    section.table.select(pick_row, None, [section.pick], trigger_mode="multiple", api_visibility="private")


def wire_navigation(inspect: Any, states: list[Any], ui: DetailUI) -> None:
    """Previous / next step, play / pause (one step per tick), and the jumps to a violation."""
    grid = ui.grid
    nav_inputs = [inspect, *states, grid.step]

    def step_by(delta: int) -> Any:
        def move(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None, step: int) -> dict:
            last = last_step(inspected(label, run_a, run_b))
            return {grid.step: min(max(int(step) + delta, 0), last)}

        return move

    grid.prev.click(step_by(-1), nav_inputs, [grid.step], api_visibility="private")
    grid.next.click(step_by(1), nav_inputs, [grid.step], api_visibility="private")

    def tick(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None, step: int) -> dict:
        if int(step) >= last_step(inspected(label, run_a, run_b)):
            return {grid.timer: gr.Timer(active=False)}  # played to the end: stop
        return {grid.step: int(step) + 1}

    grid.play.click(lambda: {grid.timer: gr.Timer(active=True)}, None, [grid.timer], api_visibility="private")
    grid.pause.click(lambda: {grid.timer: gr.Timer(active=False)}, None, [grid.timer], api_visibility="private")
    grid.timer.tick(tick, nav_inputs, [grid.step, grid.timer], api_visibility="private")
    wire_jumps(inspect, states, ui)


def wire_jumps(inspect: Any, states: list[Any], ui: DetailUI) -> None:
    """Open a violation's step and row in the grid: the first one, or the one clicked in the table."""
    grid, invariants = ui.grid, ui.invariants
    jump_inputs = [inspect, *states, grid.window]
    jump_outputs = [grid.step, *grid.view_components(), ui.tabs]

    def jump(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None, window: int, index: int) -> dict:
        loaded = inspected(label, run_a, run_b)
        if loaded is None or not loaded.report.violations:
            gr.Info("This run has no violation: every invariant holds.")
            return gr.skip()
        violation = loaded.report.violations[min(index, len(loaded.report.violations) - 1)]
        step = violation.step_index
        return {
            grid.step: step,
            **grid.view_values(grid_view(loaded, step, violation.row, window)),
            ui.tabs: gr.Tabs(selected=GRID_TAB),
        }

    def jump_first(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None, window: int) -> dict:
        return jump(label, run_a, run_b, window, 0)

    def jump_selected(label: str, run_a: Any, run_b: Any, window: int, evt: gr.SelectData) -> dict:
        index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        return jump(label, run_a, run_b, window, int(index))

    def jump_picked(label: str, run_a: Any, run_b: Any, window: int, picked: str) -> dict:
        """A timeline marker was clicked: `picked` is "<violation index>:<click time>"."""
        head = (picked or "").split(":", 1)[0]
        if not head.isdigit():
            return gr.skip()
        return jump(label, run_a, run_b, window, int(head))

    # Three bindings, not one gr.on: the table's select event and the timeline box carry the line.
    # Each jump switches to the grid tab, so the grid is refitted to its now visible container.
    refit = {"js": RESIZE_PLOTS_JS, "show_progress": "hidden", "api_visibility": "private"}
    grid.first.click(jump_first, jump_inputs, jump_outputs, api_name="jump_first_violation").then(None, **refit)
    # "multiple", as for the runs table: a second row clicked during a jump is where the reader goes.
    invariants.violations.select(
        jump_selected, jump_inputs, jump_outputs, trigger_mode="multiple", api_visibility="private"
    ).then(None, **refit)
    # change, not input: the click script sets the value, nobody types it.
    invariants.pick.change(jump_picked, [*jump_inputs, invariants.pick], jump_outputs, api_visibility="private").then(
        None, **refit
    )


def wire_share(inspect: Any, states: list[Any], ui: DetailUI) -> None:
    """The link, the report, the keys and a cell's details (`specviz.app.share`, assets.SHARE_JS)."""
    grid = ui.grid
    tools = grid.tools

    tools.copy_link.click(
        lambda link: gr.update(value=link, visible=True), [tools.link], [tools.link], js=COPY_LINK_JS,
        api_visibility="private",
    )  # fmt: skip
    tools.keys.click(None, js=TOGGLE_KEYS_JS, api_visibility="private")

    def make_report(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None) -> Any:
        try:
            return gr.update(value=share.write_report(inspected(label, run_a, run_b)), visible=True)
        except (SpecvizError, OSError) as exc:  # no run, or a full disk: a toast, the page stays
            gr.Warning(serve.without_paths(str(exc)))
            return gr.skip()

    tools.report.click(make_report, [inspect, *states], [tools.report_file], api_name="report")

    def on_cell(
        label: str, run_a: LoadedRun | None, run_b: LoadedRun | None, step: int, window: int, picked: str
    ) -> Any:
        what, numbers = share.parse_pick(picked)
        if what != "cell" or len(numbers) != 2:
            return gr.skip()
        return share.cell_details(inspected(label, run_a, run_b), int(step or 0), *numbers, window)

    tools.cell.change(
        on_cell, [inspect, *states, grid.step, grid.window, tools.cell], [tools.details], api_visibility="private",
        show_progress="hidden", trigger_mode="always_last",
    )  # fmt: skip

    def on_key(label: str, run_a: Any, run_b: Any, step: int, row: int, window: int, pressed: str) -> Any:
        key, _ = share.parse_pick(pressed)
        loaded = inspected(label, run_a, run_b)
        if loaded is None or not loaded.trace.steps:
            return gr.skip()
        step, row = int(step or 0), int(row if row is not None else NO_ROW)
        if key == "enter":
            return {tools.details: share.cell_details(loaded, step, row, None, window)}
        target = share.key_target(loaded, key, step, row)
        if target is None:
            return gr.skip()
        if key in (".", ","):  # the step's own change event draws it, with the row kept
            return {grid.step: target[0]}
        moved = {grid.step: target[0], **grid.view_values(grid_view(loaded, target[0], target[1], window))}
        if key in ("n", "N"):  # a violation is seen in the grid, as a jump from the Invariants tab shows it
            moved[ui.tabs] = gr.Tabs(selected=GRID_TAB)
        return moved

    # "multiple": every key pressed is a move, in order (a held key walks step after step).
    tools.key.change(
        on_key, [inspect, *states, grid.step, grid.row, grid.window, tools.key],
        [grid.step, *grid.view_components(), tools.details, ui.tabs], api_visibility="private",
        trigger_mode="multiple", show_progress="hidden",
    ).then(None, js=RESIZE_PLOTS_JS, show_progress="hidden", api_visibility="private")  # fmt: skip
