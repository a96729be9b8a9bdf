"""Run slots A and B: each loads a bundled trace, an upload or a live run into its own state.

Also the two controls that concern both slots: which one the detail tabs inspect, and the
metric-by-metric comparison of the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from specviz.app import memory, serve
from specviz.app.live import PUBLIC
from specviz.app.loading import LOCAL_CHOICE, first_bundled, local_choice, slot_choices
from specviz.proposers import DEFAULT_PROPOSER, REGISTRY, proposer_names
from specviz.views import slot_summary_markdown
from specviz.views.faults import faults_markdown

# Every method the engine runs (specviz.trace.schema.METHODS), the speculative ones first.
METHODS_SHOWN = ("eqspec", "exspec", "inplace", "baseline")


@dataclass
class RunSlot:
    """The controls of run slot A or B and the state holding its loaded run."""

    label: str
    state: Any
    bundled: Any
    upload: Any
    live_inputs: list[Any]  # in the order of the live-run endpoint's arguments
    # The proposer, tree and tree-kind pickers: the endpoint's last arguments (added later, so API
    # clients' positions of the others stay as they were; a client that omits them gets a chain).
    drafting_inputs: list[Any]
    run_button: Any
    download: Any
    summary: Any
    status: Any  # one line: why the last load or run failed; hidden when it did not
    # The `load_bundled_<slot>` API endpoint's trigger, never shown: an API call always loads the
    # name it sends, while the picker's own event skips a focus or blur that picks nothing.
    api_trigger: Any = None


def proposer_choices() -> list[tuple[str, str]]:
    """The proposer picker's (label, name) pairs: every proposer in the registry, in its order."""
    return [(REGISTRY[name].label, name) for name in proposer_names()]


def build_live_controls(label: str) -> tuple[list[Any], list[Any], Any, Any]:
    """The live-run accordion: (its inputs, in the endpoint's order; the proposer and tree pickers;
    the run button; the download)."""
    from specviz.engine.faults import FAULTS
    from specviz.engine.models import DEFAULT_DRAFT, DEFAULT_TARGET

    slug = label.lower()
    limits = serve.live_limits(PUBLIC)
    with gr.Accordion(f"Live run into slot {label}", open=False):
        with gr.Row():
            method = gr.Dropdown(list(METHODS_SHOWN), value="eqspec", label="method")
            fault = gr.Dropdown(["none", *FAULTS], value="none", label="fault to inject")
        with gr.Accordion("what each fault does", open=False):
            gr.Markdown(faults_markdown())
        with gr.Row():
            batch = gr.Slider(*limits["batch_size"], value=min(8, limits["batch_size"][1]), step=1, label="batch size")
            k = gr.Slider(*limits["draft_k"], value=4, step=1, label="draft tokens k")
        with gr.Row():
            proposer = gr.Dropdown(proposer_choices(), value=DEFAULT_PROPOSER, label="proposer")
            tree = gr.Slider(*limits["tree_branches"], value=0, step=1, label="tree: alternative drafts (0: a chain)")
            tree_kind = gr.Radio(
                [("static: one per depth", "static"), ("top-k: each row's best-scored", "topk")],
                value="static",
                label="tree kind",
            )
        with gr.Row():
            max_new = gr.Slider(*limits["max_new_tokens"], value=48, step=1, label="max new tokens")
            num = gr.Slider(*limits["num_prompts"], value=16, step=1, label="SpecBench prompts")
        prompts = gr.Textbox(lines=3, label="or your own prompts, one per line (overrides the SpecBench count)")
        # Public mode: the bundled pair only, and the server refuses any other value sent anyway. Its
        # fields are hidden and empty (empty: the bundled pair): the page names no server path.
        target = gr.Textbox(
            value="" if PUBLIC else DEFAULT_TARGET, label="target model (local path or hub id)", visible=not PUBLIC
        )
        draft = gr.Textbox(
            value="" if PUBLIC else DEFAULT_DRAFT, label="draft model (local path or hub id)", visible=not PUBLIC
        )
        button = gr.Button(f"Run live into {label}", variant="primary")
        # Hidden until a live run has a trace to offer: an empty file box is 270 px of nothing.
        download = gr.File(
            label="trace of the live run", interactive=False, visible=False, elem_id=f"sv-download-{slug}"
        )
    drafting = [proposer, tree, tree_kind]
    return [method, fault, batch, k, max_new, num, prompts, target, draft], drafting, button, download


def build_run_slot(label: str, defaults: tuple[str, ...]) -> RunSlot:
    slug = label.lower()
    with gr.Column(variant="panel"):
        with gr.Row(equal_height=True):
            # With `python app.py --trace PATH`, slot A's picker names that run (it is what A shows).
            local = label == "A" and local_choice() is not None
            bundled = gr.Dropdown(
                slot_choices(label),
                value=LOCAL_CHOICE if local else first_bundled(defaults),
                label=f"run {label}: bundled example trace",
                interactive=True,
                elem_id=f"sv-bundled-{slug}",
                scale=3,
            )
            # No file_types: Gradio refuses any other file with its own red "Error" toast before the
            # app sees it; the app reads the file and says in its own line what it is instead.
            upload = gr.UploadButton("or upload a trace", type="filepath", size="sm", scale=1)
        live_inputs, drafting_inputs, button, download = build_live_controls(label)
        status = gr.Markdown(visible=False, elem_classes=["sv-status"], elem_id=f"sv-status-{slug}")
        summary = gr.Markdown(
            slot_summary_markdown(None, label), elem_classes=["sv-summary"], elem_id=f"sv-summary-{slug}"
        )
    # A session's runs expire and their memory goes back to the system (tabs left open included).
    state = gr.State(None, time_to_live=serve.SESSION_TTL_S, delete_callback=memory.release_memory)
    api_trigger = gr.Button(visible=False, elem_id=f"sv-load-bundled-{slug}")
    return RunSlot(
        label=label, state=state, bundled=bundled, upload=upload, live_inputs=live_inputs,
        drafting_inputs=drafting_inputs, run_button=button,
        download=download, summary=summary, status=status, api_trigger=api_trigger,
    )  # fmt: skip


def build_inspect_switch() -> Any:
    """Which slot the detail tabs inspect; loading a run into a slot switches to it."""
    return gr.Radio(
        [("inspect run A", "A"), ("inspect run B", "B")],
        value="A",
        container=False,
        interactive=True,
        elem_id="sv-inspect",
    )


def build_compare() -> Any:
    """The A vs B table; built inside the detail tabs (its own tab, beside the others)."""
    return gr.Dataframe(
        label="A vs B, metric by metric (throughput is per run; compare speed within one run only)",
        elem_id="sv-compare",
    )
