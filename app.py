"""specviz web app: see where batch speculative decoding desynchronises.

`python app.py` serves it (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT are honoured by Gradio). Tests
import `build_app` and `launch`. This file only wires: every figure, table and text comes from
`specviz.views`, every run from `specviz.engine`, every check from `specviz.analysis`.

Two run slots, A and B, each loaded from a bundled trace, an uploaded trace or a live run; the
detail tabs inspect one slot at a time, and the outputs tab shows the other beside it.
"""

from __future__ import annotations

import functools
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from specviz import serve
from specviz.errors import SpecvizError
from specviz.trace.io import TraceError, load_trace, parse_trace_bytes, save_trace
from specviz.trace.naming import run_slug
from specviz.views import (
    GridView,
    LoadedRun,
    acceptance_figure,
    acceptance_heatmap,
    acceptance_markdown,
    analyse,
    drift_heatmap,
    empty_figure,
    grid_view,
    kv_heatmap,
    sequence_table,
    slot_outputs_html,
    slot_summary_markdown,
    slots_compare_table,
    timeline_figure,
    violations_table,
)
from specviz.views.faults import faults_markdown
from specviz.views.grid import DEFAULT_WINDOW, NO_ROW
from specviz.views.outputs import OUTPUTS_CSS, PER_PAGE, page_count
from specviz.views.safe_text import md_text

ROOT = Path(__file__).resolve().parent
TRACES = ROOT / "traces"
MAX_UPLOAD_BYTES = 32 * 1024 * 1024  # bundled traces are KBs; a 480x128 run is a few MB gzipped
# Bounded, so memory stays flat under a flood; live runs take at most serve.MAX_PENDING_LIVE of it
# (refused before they queue), so loading and inspecting always find room.
QUEUE_SIZE = 256
INSPECT_CONCURRENCY = 4  # loading and inspecting: their own lane, never behind a live run
PLAY_SECONDS = 0.8
# Opening pair, first bundled one wins: A is the run under investigation (the page opens on its
# first red cell), B the same prompts decoded correctly. Real text turning into garbage first.
DEFAULT_A = ("gemma-eqspec-uniform-advance.json.gz", "default-eqspec-stale-kv.json.gz")
DEFAULT_B = ("gemma-eqspec.json.gz", "default-eqspec.json.gz")

# Live runs share this machine's CPU with everyone: bounds that keep one run to about a minute
# (smaller in public mode, see specviz.serve).
LIVE_LIMITS = serve.LOCAL_LIMITS
PUBLIC = serve.public_mode()  # a Space (SPACE_ID) or `python app.py --public`
LIVE_GATE = serve.LiveRunGate()
LIVE_FOLDER = serve.LiveFolder()

# A plot drawn while its tab is hidden is laid out at the wrong width (plotly measures a hidden
# container); Gradio does not tell plotly when the tab shows, so do it on every tab switch.
RESIZE_PLOTS_JS = """() => {
  const fit = () => document.querySelectorAll('.js-plotly-plot').forEach((gd) => {
    if (gd.offsetParent !== null && window.Plotly) window.Plotly.Plots.resize(gd);
  });
  requestAnimationFrame(fit);
  setTimeout(fit, 200);
}"""
# gr.Plot has no click event: a click on a timeline marker writes the index of its first violation
# (customdata[2], see views.timeline) into the hidden #sv-timeline-pick box, whose input event jumps.
TIMELINE_CLICK_JS = """() => {
  const send = (data) => {
    const point = data && data.points && data.points[0];
    const index = point && point.customdata ? point.customdata[2] : undefined;
    const box = document.querySelector('#sv-timeline-pick textarea, #sv-timeline-pick input');
    if (index === undefined || index === null || !box) return;
    box.value = `${index}:${Date.now()}`;  // a new value on every click: the same marker twice jumps twice
    box.dispatchEvent(new Event('input', { bubbles: true }));
  };
  // Gradio may draw a new plot element on each update: hook every one that appears.
  setInterval(() => {
    const gd = document.querySelector('#sv-timeline .js-plotly-plot');
    if (gd && gd.on && !gd.__svClick) {
      gd.on('plotly_click', send);
      gd.__svClick = true;
    }
  }, 400);
}"""

CSS = (
    OUTPUTS_CSS
    + """
.sv-summary { min-height: 120px; }
#sv-intro p { margin: 2px 0; }
/* Headers break between words or not at all: "violations", never "violatio ns". The data tables'
   headers stay on one line; the summary's may wrap between words, so its table fits its panel. */
.table-wrap th, th .cell-wrap, th span { word-break: normal !important;
  overflow-wrap: normal !important; white-space: nowrap !important; hyphens: none; }
.sv-summary th { word-break: keep-all !important; overflow-wrap: normal !important; hyphens: none; }
.sv-status { color: #991b1b; background: #fef2f2; border-radius: 6px; padding: 2px 8px; }
.sv-status p { margin: 0; }
/* A plotly click on the timeline is sent through this box; nobody types in it. */
#sv-timeline-pick { display: none !important; }
"""
)

INTRO = """
# specviz: where does batch speculative decoding go wrong?
Load runs into slots **A** and **B** (bundled example, your trace file, or a live run). The **ragged grid** draws one
line per batch row and one cell per token slot, with the fed position ID in each cell. **Red outline**: the fed state
differs from what a correct engine feeds. **Dark red cell**: where desynchronisation begins.
"""


# ----------------------------------------------------------------------------- loading


def bundled_traces() -> list[str]:
    return sorted(p.name for p in TRACES.glob("*.json.gz"))


@functools.lru_cache(maxsize=32)
def _analysed_bundle(name: str, mtime: float) -> LoadedRun:
    """Bundled traces are shared by every session; analyse each once (mtime busts the cache)."""
    return analyse(load_trace(TRACES / name), name)


def first_bundled(candidates: tuple[str, ...]) -> str | None:
    names = bundled_traces()
    return next((name for name in candidates if name in names), None)


def load_bundled(name: str | None) -> LoadedRun:
    if not name:
        raise SpecvizError("pick a bundled trace first")
    if name not in bundled_traces():  # only names from the list: no paths from the client
        raise SpecvizError(f"{name}: not a bundled trace")
    path = TRACES / name
    return _analysed_bundle(name, path.stat().st_mtime)


def load_upload(path: str | None) -> LoadedRun:
    if not path:
        raise SpecvizError("no file uploaded")
    file = Path(path)
    size = file.stat().st_size
    if size > MAX_UPLOAD_BYTES:
        raise SpecvizError(f"{file.name}: {size / 1e6:.1f} MB is over the {MAX_UPLOAD_BYTES // 2**20} MiB upload limit")
    try:
        raw = file.read_bytes()
    finally:  # read once, then gone: uploads never pile up in the Space's disk
        serve.delete_upload(file)
    # Strip Gradio's temp folder from messages: the user knows the file by its name.
    return analyse(parse_trace_bytes(raw, file.name), f"upload {file.name}")


@functools.lru_cache(maxsize=2)
def load_model_pair(target: str, draft: str, with_draft: bool) -> Any:
    """Loading is the slow part of a live run; keep the last pairs (tests replace this function)."""
    import torch

    from specviz.engine.models import load_pair

    torch.set_num_threads(1)  # small models on a shared CPU: more threads only add contention
    return load_pair(target, draft, device="cpu", with_draft=with_draft)


@dataclass
class LiveRequest:
    method: str
    fault: str
    batch_size: int
    draft_k: int
    max_new_tokens: int
    num_prompts: int
    prompts_text: str
    target: str
    draft: str

    def prompts(self) -> list[str]:
        from specviz.data import load_specbench

        return self.own_prompts() or load_specbench("heldout")[: self.num_prompts]

    def own_prompts(self) -> list[str]:
        return [line.strip() for line in (self.prompts_text or "").splitlines() if line.strip()]

    def validate(self, public: bool = False) -> None:
        limits = serve.live_limits(public)
        for name, (low, high) in limits.items():
            value = getattr(self, name)
            if not isinstance(value, int) or not low <= value <= high:
                raise SpecvizError(f"{name.replace('_', ' ')} must be between {low} and {high}, got {value}")
        if public:  # before anything touches a path: the answer must not depend on it
            from specviz.engine.models import DEFAULT_DRAFT, DEFAULT_TARGET

            serve.public_models_only(self.target, self.draft, (DEFAULT_TARGET, DEFAULT_DRAFT))
        elif not (self.target or "").strip():
            raise SpecvizError("target model path is empty")
        chars = serve.prompt_char_limit(public)
        if len(self.prompts_text or "") > chars * limits["num_prompts"][1]:
            raise SpecvizError(f"prompts text is over {chars * limits['num_prompts'][1]} characters")
        most = limits["num_prompts"][1]
        own = self.own_prompts()
        if len(own) > most:
            raise SpecvizError(f"{len(own)} prompts given; a live run takes at most {most}")
        if any(len(p) > chars for p in own):
            raise SpecvizError(f"a prompt is over {chars} characters")


def live_run(request: LiveRequest, progress: gr.Progress, public: bool = False) -> LoadedRun:
    from specviz.engine.models import DEFAULT_DRAFT, DEFAULT_TARGET
    from specviz.engine.run import RunConfig, run

    request.validate(public)
    config = RunConfig(
        method=request.method,
        fault=None if request.fault in ("", "none") else request.fault,
        batch_size=request.batch_size,
        draft_k=request.draft_k,
        max_new_tokens=request.max_new_tokens,
    )
    config.validate()
    progress(0, desc="loading models")
    target = request.target.strip() or DEFAULT_TARGET
    draft = request.draft.strip() or DEFAULT_DRAFT
    pair = load_model_pair(target, draft, config.k > 0)

    def report(phase: str, done: int, total: int) -> None:
        # The reference decodes one prompt at a time; the speculative run counts emitted tokens.
        if phase == "reference":
            progress((done, total), desc="reference (greedy, batch 1)", unit="prompts")
        else:
            progress((done, total), desc=f"{config.method} decoding", unit="tokens")

    trace = run(pair, request.prompts(), config, progress=report)  # the trace carries its token text
    return analyse(trace, "live run")


def _whole(value: float | int) -> int | float:
    """Sliders send floats; a whole float is the int the user meant, anything else stays to be refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def save_for_download(loaded: LoadedRun) -> str:
    """The live run's trace in the app's live folder, whose old files are pruned on every save."""
    name = run_slug(loaded.trace.header.method, loaded.trace.header.fault)
    return str(save_trace(loaded.trace, LIVE_FOLDER.new_file(f"live-{name}.json.gz")))


def status_update(message: str = "") -> Any:
    """The slot's one-line status: shown with a message, hidden when empty."""
    # The message may quote an upload (its name, a field it invented): escaped, one line.
    return gr.update(value=f"⚠️ {md_text(message, 400)}" if message else "", visible=bool(message))


def user_errors(status: Any) -> Any:
    """Turn every failure into a one-line message in `status` (and a warning toast), never an exception.

    A raised gr.Error marks every output of the event with Gradio's red "Error" badge and blanks
    them until the next update; a message leaves every output as it was: the slot keeps its run.
    """

    def decorate(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except (gr.Error, SpecvizError, TraceError, ValueError) as exc:
                message = exc.message if isinstance(exc, gr.Error) else str(exc)
            except Exception as exc:  # never a traceback in the UI; the server log keeps it
                traceback.print_exc()
                message = f"unexpected error: {type(exc).__name__}: {exc}"
            gr.Warning(message)
            return {status: status_update(message)}

        return wrapper

    return decorate


# ----------------------------------------------------------------------------- layout


@dataclass
class RunSlot:
    """The controls of run slot A or B and the state holding its loaded run."""

    label: str
    state: Any
    bundled: Any
    upload: Any
    live_inputs: list[Any]
    run_button: Any
    download: Any
    summary: Any
    status: Any  # one line: why the last load or run failed; hidden when it did not


@dataclass
class DetailUI:
    """The detail tabs; its methods say what each component shows, as `{component: value}`."""

    tabs: Any
    step: Any
    row: Any
    window: Any
    prev: Any
    next: Any
    play: Any
    pause: Any
    first: Any
    timer: Any
    grid: Any
    step_text: Any
    row_text: Any
    timeline: Any
    violations: Any
    acceptance_text: Any
    acceptance: Any
    acceptance_map: Any
    sequences: Any
    kv: Any
    drift: Any
    page: Any
    only_diverged: Any
    outputs: Any
    timeline_pick: Any  # a click on a timeline marker lands here (see TIMELINE_CLICK_JS)

    def grid_components(self) -> list[Any]:
        return [self.row, self.grid, self.step_text, self.row_text]

    def detail_components(self) -> list[Any]:
        """Everything `details` sets. A list, not a set: the API returns values in this order."""
        return [
            self.step,
            self.first,
            *self.grid_components(),
            self.timeline,
            self.violations,
            self.acceptance_text,
            self.acceptance,
            self.acceptance_map,
            self.sequences,
            self.kv,
            self.drift,
            self.page,
            self.outputs,
        ]

    def grid_values(self, view: GridView) -> dict[Any, Any]:
        return {
            self.row: gr.update(choices=view.row_choices, value=view.row),
            self.grid: view.figure,
            self.step_text: view.step_text,
            self.row_text: view.row_text,
        }

    def details(self, loaded: LoadedRun | None, other: LoadedRun | None, label: str, window: int, only: bool) -> dict:
        """Every detail output for the inspected run, opening on its first violation."""
        if loaded is None:
            return self._empty_details(label, window, only)
        trace, report = loaded.trace, loaded.report
        first = report.first_violation
        start = loaded.start_step_index()
        return {
            self.step: gr.update(minimum=0, maximum=max(loaded.step_count - 1, 1), value=start),
            self.first: gr.update(variant="primary" if first else "secondary"),  # nothing to jump to on a clean run
            **self.grid_values(grid_view(loaded, start, first.row if first else NO_ROW, window)),
            self.timeline: loaded.figure("timeline", lambda: timeline_figure(trace, report)),
            self.violations: violations_table(report),
            self.acceptance_text: acceptance_markdown(trace),
            self.acceptance: loaded.figure("acceptance", lambda: acceptance_figure(trace)),
            self.acceptance_map: loaded.figure("acceptance_heatmap", lambda: acceptance_heatmap(trace)),
            self.sequences: sequence_table(trace, report),
            self.kv: loaded.figure("kv", lambda: kv_heatmap(trace)),
            self.drift: loaded.figure("drift", lambda: drift_heatmap(trace)),
            self.page: gr.update(value=1, maximum=page_count(report, PER_PAGE, only)),
            self.outputs: slot_outputs_html(loaded, other, label, 1, only),
        }

    def _empty_details(self, label: str, window: int, only: bool) -> dict:
        empty = empty_figure(f"Run {label} is empty: load a trace into slot {label}.")
        return {
            self.step: gr.update(minimum=0, maximum=1, value=0),
            self.first: gr.update(variant="secondary"),
            **self.grid_values(grid_view(None, 0, NO_ROW, window)),
            **dict.fromkeys([self.timeline, self.acceptance, self.acceptance_map, self.kv, self.drift], empty),
            self.violations: pd.DataFrame(),
            self.acceptance_text: "",
            self.sequences: pd.DataFrame(),
            self.page: gr.update(value=1, maximum=1),
            self.outputs: slot_outputs_html(None, None, label, 1, only),
        }


def _live_controls(label: str) -> tuple[list[Any], Any, Any]:
    from specviz.engine.faults import FAULTS
    from specviz.engine.models import DEFAULT_DRAFT, DEFAULT_TARGET

    slug = label.lower()
    limits = serve.live_limits(PUBLIC)
    with gr.Accordion(f"Live run into slot {label}", open=False):
        with gr.Row():
            method = gr.Dropdown(["eqspec", "exspec", "baseline"], value="eqspec", label="method")
            fault = gr.Dropdown(["none", *FAULTS], value="none", label="fault to inject")
        with gr.Accordion("what each fault does", open=False):
            gr.Markdown(faults_markdown())
        with gr.Row():
            batch = gr.Slider(*limits["batch_size"], value=min(8, limits["batch_size"][1]), step=1, label="batch size")
            k = gr.Slider(*limits["draft_k"], value=4, step=1, label="draft tokens k")
        with gr.Row():
            max_new = gr.Slider(*limits["max_new_tokens"], value=48, step=1, label="max new tokens")
            num = gr.Slider(*limits["num_prompts"], value=16, step=1, label="SpecBench prompts")
        prompts = gr.Textbox(lines=3, label="or your own prompts, one per line (overrides the SpecBench count)")
        # Public mode: the bundled pair only, and the server refuses any other value sent anyway.
        target = gr.Textbox(value=DEFAULT_TARGET, label="target model (local path or hub id)", visible=not PUBLIC)
        draft = gr.Textbox(value=DEFAULT_DRAFT, label="draft model (local path or hub id)", visible=not PUBLIC)
        button = gr.Button(f"Run live into {label}", variant="primary")
        # Hidden until a live run has a trace to offer: an empty file box is 270 px of nothing.
        download = gr.File(
            label="trace of the live run", interactive=False, visible=False, elem_id=f"sv-download-{slug}"
        )
    return [method, fault, batch, k, max_new, num, prompts, target, draft], button, download


def _run_slot(label: str, defaults: tuple[str, ...]) -> RunSlot:
    slug = label.lower()
    with gr.Column(variant="panel"):
        with gr.Row(equal_height=True):
            bundled = gr.Dropdown(
                bundled_traces(),
                value=first_bundled(defaults),
                label=f"run {label}: bundled example trace",
                interactive=True,
                elem_id=f"sv-bundled-{slug}",
                scale=3,
            )
            upload = gr.UploadButton(
                "or upload a trace", file_types=[".json", ".gz"], type="filepath", size="sm", scale=1
            )
        live_inputs, button, download = _live_controls(label)
        status = gr.Markdown(visible=False, elem_classes=["sv-status"], elem_id=f"sv-status-{slug}")
        summary = gr.Markdown(
            slot_summary_markdown(None, label), elem_classes=["sv-summary"], elem_id=f"sv-summary-{slug}"
        )
    # A session's runs expire and their memory goes back to the system (tabs left open included).
    state = gr.State(None, time_to_live=serve.SESSION_TTL_S, delete_callback=serve.release_memory)
    return RunSlot(label, state, bundled, upload, live_inputs, button, download, summary, status)


def build_app() -> gr.Blocks:
    gr.set_static_paths([ROOT / "docs"])  # docs/faults.md, linked from each fault's one-liner
    # delete_cache: Gradio's own copies (uploads, downloads) go after FILE_MAX_AGE_S, checked every 5 min.
    with gr.Blocks(title="specviz", delete_cache=(300, serve.FILE_MAX_AGE_S)) as demo:
        gr.Markdown(INTRO, elem_id="sv-intro")
        with gr.Row(equal_height=False):
            slot_a = _run_slot("A", DEFAULT_A)
            slot_b = _run_slot("B", DEFAULT_B)
        inspect = gr.Radio(
            [("inspect run A", "A"), ("inspect run B", "B")],
            value="A",
            container=False,
            interactive=True,
            elem_id="sv-inspect",
        )
        ui = _detail_tabs()
        with gr.Accordion("A vs B, metric by metric", open=False):
            compare = gr.Dataframe(
                label="A vs B (throughput is per run; compare speed within one run only)", elem_id="sv-compare"
            )
        _wire(demo, slot_a, slot_b, inspect, compare, ui)
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=INSPECT_CONCURRENCY)
    serve.install_gate(demo, LIVE_GATE)  # one live run per visitor, refused before it queues
    demo.unload(serve.release_memory)  # a closed tab's runs are freed by Gradio; give the memory back
    return demo


def _detail_tabs() -> DetailUI:
    with gr.Tabs() as tabs:
        with gr.Tab("Ragged grid", id="grid") as grid_tab:
            with gr.Row():
                step = gr.Slider(0, 1, value=0, step=1, label="step", scale=4, elem_id="sv-step")
                row = gr.Dropdown([("none", NO_ROW)], value=NO_ROW, label="highlight row", scale=1, elem_id="sv-row")
                window = gr.Slider(8, 512, value=DEFAULT_WINDOW, step=8, label="cache slots shown", scale=2)
            with gr.Row():
                prev = gr.Button("◀ previous step", size="sm")
                nxt = gr.Button("next step ▶", size="sm")
                play = gr.Button("play ▶", size="sm")
                pause = gr.Button("pause", size="sm")
                first = gr.Button("jump to first violation", size="sm", variant="primary", elem_id="sv-first")
            timer = gr.Timer(PLAY_SECONDS, active=False)
            grid = gr.Plot(label="ragged grid", elem_id="sv-grid")
            with gr.Row():
                step_text = gr.Markdown(elem_id="sv-step-text")
                row_text = gr.Markdown(elem_id="sv-row-text")
        with gr.Tab("Invariants", id="invariants") as invariants_tab:
            timeline = gr.Plot(label="invariant timeline (click a marker to open it)", elem_id="sv-timeline")
            timeline_pick = gr.Textbox(show_label=False, container=False, elem_id="sv-timeline-pick")
            violations = gr.Dataframe(
                label="violations: click one to open its step and row in the grid",
                interactive=False,
                wrap=True,
                # The message says what broke: it gets the room (and wraps), the numbers get little.
                column_widths=["5%", "5%", "5%", "13%", "10%", "14%", "14%", "34%"],
                elem_id="sv-violations",
            )
        with gr.Tab("Acceptance", id="acceptance") as acceptance_tab:
            acceptance_text = gr.Markdown(elem_id="sv-acceptance-text")
            acceptance = gr.Plot(label="acceptance metrics", elem_id="sv-acceptance")
            acceptance_map = gr.Plot(label="acceptance heatmap", elem_id="sv-acceptance-map")
            sequences = gr.Dataframe(label="per sequence", interactive=False, elem_id="sv-sequences")
        with gr.Tab("KV & positions", id="kv") as kv_tab:
            kv = gr.Plot(label="KV length error", elem_id="sv-kv")
            drift = gr.Plot(label="position-ID drift", elem_id="sv-drift")
        with gr.Tab("Outputs", id="outputs") as outputs_tab:
            with gr.Row():
                page = gr.Number(value=1, minimum=1, maximum=1, precision=0, label="page", scale=1, elem_id="sv-page")
                only_diverged = gr.Checkbox(value=False, label="only divergent sequences", scale=2)
            outputs = gr.HTML(elem_id="sv-outputs")
    for tab in (grid_tab, invariants_tab, acceptance_tab, kv_tab, outputs_tab):
        tab.select(None, None, None, js=RESIZE_PLOTS_JS, queue=False, show_progress="hidden", api_visibility="private")
    return DetailUI(
        tabs, step, row, window, prev, nxt, play, pause, first, timer, grid, step_text, row_text, timeline,
        violations, acceptance_text, acceptance, acceptance_map, sequences, kv, drift, page, only_diverged, outputs,
        timeline_pick,
    )  # fmt: skip


# ----------------------------------------------------------------------------- events


def _pick(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None) -> tuple[LoadedRun | None, LoadedRun | None]:
    """(inspected run, the other one) for the inspect switch's value."""
    return (run_a, run_b) if label == "A" else (run_b, run_a)


def _inspected(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None) -> LoadedRun | None:
    return run_a if label == "A" else run_b


def _last_step(loaded: LoadedRun | None) -> int:
    return max(loaded.step_count - 1, 0) if loaded is not None else 0


def _wire(demo: gr.Blocks, slot_a: RunSlot, slot_b: RunSlot, inspect: Any, compare: Any, ui: DetailUI) -> None:
    for slot, other in ((slot_a, slot_b), (slot_b, slot_a)):
        _wire_slot(slot, other, inspect, compare, ui)
    states = [slot_a.state, slot_b.state]

    def on_inspect(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None, window: int, only: bool) -> dict:
        loaded, other = _pick(label, run_a, run_b)
        return ui.details(loaded, other, label, window, only)

    inspect.change(
        on_inspect, [inspect, *states, ui.window, ui.only_diverged], ui.detail_components(), api_name="inspect"
    )

    def on_grid(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None, step: int, row: int, window: int):
        return ui.grid_values(grid_view(_inspected(label, run_a, run_b), step, row, window))

    gr.on(
        [ui.step.change, ui.row.input, ui.window.release],
        on_grid,
        [inspect, *states, ui.step, ui.row, ui.window],
        ui.grid_components(),
        api_name="grid",
        trigger_mode="always_last",  # dragging the slider: draw the step it rests on, not every one passed
    )
    _wire_navigation(inspect, states, ui)

    def on_page(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None, page: int, only: bool) -> dict:
        loaded, other = _pick(label, run_a, run_b)
        return {ui.outputs: slot_outputs_html(loaded, other, label, page, only)}

    gr.on(
        [ui.page.change, ui.only_diverged.change],
        on_page,
        [inspect, *states, ui.page, ui.only_diverged],
        [ui.outputs],
        api_visibility="private",
    )

    def preload(window: int, only: bool) -> dict:
        """Open on the default pair of examples, inspecting A; a missing bundle leaves the slot empty."""
        run_a, run_b = _load_default(DEFAULT_A), _load_default(DEFAULT_B)
        return {
            slot_a.state: run_a,
            slot_b.state: run_b,
            slot_a.summary: slot_summary_markdown(run_a, "A"),
            slot_b.summary: slot_summary_markdown(run_b, "B"),
            compare: slots_compare_table(run_a, run_b),
            **ui.details(run_a, run_b, "A", window, only),
        }

    demo.load(None, js=TIMELINE_CLICK_JS, api_visibility="private")
    demo.load(
        preload,
        [ui.window, ui.only_diverged],
        [*states, slot_a.summary, slot_b.summary, compare, *ui.detail_components()],
        api_visibility="private",
    )


def _load_default(candidates: tuple[str, ...]) -> LoadedRun | None:
    try:
        return load_bundled(first_bundled(candidates))
    except (SpecvizError, TraceError):
        return None


def _wire_slot(slot: RunSlot, other: RunSlot, inspect: Any, compare: Any, ui: DetailUI) -> None:
    label = slot.label.lower()
    outputs = [slot.state, slot.summary, slot.status, slot.bundled, inspect, compare, *ui.detail_components()]
    a_first = slot.label == "A"

    def finish(loaded: LoadedRun, other_run: LoadedRun | None, window: int, only: bool, bundled: bool) -> dict:
        """A run lands in this slot: show it, inspect it, compare it with the other slot's."""
        run_a, run_b = (loaded, other_run) if a_first else (other_run, loaded)
        return {
            slot.state: loaded,
            slot.summary: slot_summary_markdown(loaded, slot.label),
            slot.status: status_update(),  # the last failure is history once a run lands
            # An uploaded or live run is no bundled example: the picker must not name the old one.
            **({} if bundled else {slot.bundled: gr.update(value=None)}),
            inspect: slot.label,
            compare: slots_compare_table(run_a, run_b),
            **ui.details(loaded, other_run, slot.label, window, only),
        }

    @user_errors(slot.status)
    def from_bundle(name: str, other_run: LoadedRun | None, window: int, only: bool) -> dict:
        return finish(load_bundled(name), other_run, window, only, bundled=True)

    @user_errors(slot.status)
    def from_upload(path: str | None, other_run: LoadedRun | None, window: int, only: bool) -> dict:
        return finish(load_upload(path), other_run, window, only, bundled=False)

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
        request: gr.Request,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 - how Gradio injects progress
    ) -> dict:
        try:
            sizes = [_whole(v) for v in (batch_size, draft_k, max_new_tokens, num_prompts)]
            loaded = live_run(LiveRequest(method, fault, *sizes, prompts, target, draft), progress, PUBLIC)
            download = gr.update(value=save_for_download(loaded), visible=True)
            return {**finish(loaded, other_run, window, only, bundled=False), slot.download: download}
        finally:
            LIVE_GATE.done(getattr(request, "session_hash", None))

    common = [other.state, ui.window, ui.only_diverged]
    slot.bundled.input(from_bundle, [slot.bundled, *common], outputs, api_name=f"load_bundled_{label}")
    slot.upload.upload(from_upload, [slot.upload, *common], outputs, api_name=f"load_upload_{label}")
    slot.run_button.click(
        from_live,
        [*slot.live_inputs, *common],
        [*outputs, slot.download],
        api_name=f"live_run_{label}",
        show_progress_on=[slot.summary],  # one progress bar per run, under the button that started it
        concurrency_limit=1,
        concurrency_id=serve.LIVE_CONCURRENCY_ID,  # one live run at a time across both slots: it takes the CPU
    )


def _wire_navigation(inspect: Any, states: list[Any], ui: DetailUI) -> None:
    nav_inputs = [inspect, *states, ui.step]

    def step_by(delta: int) -> Any:
        def move(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None, step: int) -> dict:
            last = _last_step(_inspected(label, run_a, run_b))
            return {ui.step: min(max(int(step) + delta, 0), last)}

        return move

    ui.prev.click(step_by(-1), nav_inputs, [ui.step], api_visibility="private")
    ui.next.click(step_by(1), nav_inputs, [ui.step], api_visibility="private")

    def tick(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None, step: int) -> dict:
        if int(step) >= _last_step(_inspected(label, run_a, run_b)):
            return {ui.timer: gr.Timer(active=False)}  # played to the end: stop
        return {ui.step: int(step) + 1}

    ui.play.click(lambda: {ui.timer: gr.Timer(active=True)}, None, [ui.timer], api_visibility="private")
    ui.pause.click(lambda: {ui.timer: gr.Timer(active=False)}, None, [ui.timer], api_visibility="private")
    ui.timer.tick(tick, nav_inputs, [ui.step, ui.timer], api_visibility="private")
    _wire_jumps(inspect, states, ui)


def _wire_jumps(inspect: Any, states: list[Any], ui: DetailUI) -> None:
    """Open a violation's step and row in the grid: the first one, or the one clicked in the table."""
    jump_inputs = [inspect, *states, ui.window]
    jump_outputs = [ui.step, *ui.grid_components(), ui.tabs]

    def jump(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None, window: int, index: int) -> dict:
        loaded = _inspected(label, run_a, run_b)
        if loaded is None or not loaded.report.violations:
            gr.Info("This run has no violation: every invariant holds.")
            return gr.skip()
        violation = loaded.report.violations[min(index, len(loaded.report.violations) - 1)]
        step = violation.step_index
        return {
            ui.step: step,
            **ui.grid_values(grid_view(loaded, step, violation.row, window)),
            ui.tabs: gr.Tabs(selected="grid"),
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
    ui.first.click(jump_first, jump_inputs, jump_outputs, api_name="jump_first_violation").then(
        None, js=RESIZE_PLOTS_JS, show_progress="hidden", api_visibility="private"
    )
    ui.violations.select(jump_selected, jump_inputs, jump_outputs, api_visibility="private").then(
        None, js=RESIZE_PLOTS_JS, show_progress="hidden", api_visibility="private"
    )
    # change, not input: the click script sets the value, nobody types it.
    ui.timeline_pick.change(jump_picked, [*jump_inputs, ui.timeline_pick], jump_outputs, api_visibility="private").then(
        None, js=RESIZE_PLOTS_JS, show_progress="hidden", api_visibility="private"
    )


# ----------------------------------------------------------------------------- entry point


def launch(demo: gr.Blocks, **kwargs: Any) -> Any:
    """Launch with the app's settings; host and port come from GRADIO_SERVER_NAME/PORT or kwargs."""
    return demo.launch(max_file_size=MAX_UPLOAD_BYTES, css=CSS, theme=gr.themes.Soft(), **kwargs)


def main() -> None:
    if PUBLIC:
        # Load the bundled pair before the first visitor: a first live run would otherwise import
        # transformers' model code under the import lock, and other visitors' requests wait on it.
        from specviz.engine.models import DEFAULT_DRAFT, DEFAULT_TARGET

        load_model_pair(DEFAULT_TARGET, DEFAULT_DRAFT, True)
    serve.start_sweeper()  # refused uploads leave empty temp files Gradio's cleanup misses
    launch(build_app())


if __name__ == "__main__":
    main()
