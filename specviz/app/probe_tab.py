"""The server-probe section: opens a saved `specviz probe` report and draws it.

The app never probes anything itself: a visitor opens a bundled report (`traces/probe-*.json`) or
uploads one, so no URL reaches the server in any mode (a public Space must never connect to an
address a visitor chose). A report is untrusted input: read once with a byte cap (in public mode
also a prompt cap, checked before the report is built), validated by
`specviz.probe.report_read.parse_report`, drawn by `specviz.views.probe` (escaped, bounded: at most
`MAX_MAP_PROMPTS` rows, points, bars or dropdown entries, worst first). Every string a report
carries reaches the page as escaped HTML text: no Markdown is made from it, so no image, link or
tag of its own can load anything into a visitor's page.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from specviz.app import serve, uploads
from specviz.app.loading import TRACES
from specviz.errors import SpecvizError
from specviz.probe import positions
from specviz.probe.advice import placeholder_line
from specviz.probe.report import VERDICTS, Acceptance, ProbeReport, ReportError
from specviz.probe.report_read import load_report, parse_report
from specviz.views.faults import DOCS_URL_PREFIX
from specviz.views.probe import (
    MAX_MAP_PROMPTS,
    answers_html,
    divergence_map,
    noise_vs_swing,
    positions_plot,
    rounds_plot,
    sweep_plot,
    worst_first,
)
from specviz.views.safe_text import html_text

MAX_REPORT_UPLOAD_BYTES = 8 * 1024 * 1024  # a report of 10,000 prompts is a few MB
# Public mode: a report of more prompts is refused before it is built (its parse and first
# render stay within the 3 s of CPU an upload may cost; docs/probe.md has the measurement).
PUBLIC_MAX_PROMPTS = 5_000
PROBE_DOC_URL = DOCS_URL_PREFIX + "probe.md"  # served by specviz.app.doc_pages: no server path in a link


def bundled_reports() -> list[str]:
    return sorted(p.name for p in TRACES.glob("probe-*.json"))


@dataclass
class ProbeSection:
    bundled: Any
    open_bundled: Any
    upload: Any
    status: Any
    summary: Any
    map: Any
    noise: Any
    sweep: Any
    rounds: Any
    prompt: Any
    answers: Any
    state: Any
    positions: Any = None  # acceptance per draft position

    @classmethod
    def build(cls) -> ProbeSection:
        names = bundled_reports()
        local = LOCAL_PROBE[0] if LOCAL_PROBE else None  # `python app.py --probe PATH`: shown open
        with gr.Accordion("Server probe reports", open=local is not None, elem_id="sv-probe"):
            gr.Markdown(
                "Open a report written by `specviz probe URL [URL_B] --out report.json` "
                f"([docs/probe.md]({PROBE_DOC_URL})): the same prompts sent alone and together, or to two "
                "servers, compared token by token. The app only opens reports; it never contacts a server."
            )
            with gr.Row(elem_id="sv-probe-open"):
                bundled = gr.Dropdown(names, value=names[0] if names else None, label="bundled report")
                open_bundled = gr.Button("open", variant="secondary")
                upload = gr.File(label="or upload a report (.json)", file_types=[".json"], type="filepath")
            drawn = _drawn(local) if local is not None else {}  # every page opens with it drawn
            status = gr.Markdown(elem_id="sv-probe-status")
            summary = gr.HTML(drawn.get("summary"), elem_id="sv-probe-summary")
            with gr.Row(elem_id="sv-probe-plots"):
                map_plot = gr.Plot(drawn.get("map"), label="where the answers part")
                noise_plot = gr.Plot(drawn.get("noise"), label="divergences against the noise")
            with gr.Row(elem_id="sv-probe-sweep"):
                sweep = gr.Plot(drawn.get("sweep"), label="divergence and acceptance against concurrency")
                rounds = gr.Plot(drawn.get("rounds"), label="divergence over the rounds")
            by_position = gr.Plot(drawn.get("positions"), label="acceptance per draft position")
            prompt = gr.Dropdown(
                drawn.get("choices", []), value=drawn.get("first"), label="prompt (worst first)",
                elem_id="sv-probe-prompt",
            )  # fmt: skip
            answers = gr.HTML(drawn.get("answers"), elem_id="sv-probe-answers")
        return cls(
            bundled, open_bundled, upload, status, summary, map_plot, noise_plot, sweep, rounds, prompt, answers,
            gr.State(local), by_position,
        )  # fmt: skip

    def show(self, report: ProbeReport) -> dict:
        drawn = _drawn(report)
        return {
            self.state: report,
            self.status: "",
            self.summary: drawn["summary"],
            self.map: drawn["map"],
            self.noise: drawn["noise"],
            self.sweep: drawn["sweep"],
            self.rounds: drawn["rounds"],
            self.prompt: gr.update(choices=drawn["choices"], value=drawn["first"]),
            self.answers: drawn["answers"],
            self.positions: drawn["positions"],
        }


def _drawn(report: ProbeReport) -> dict[str, Any]:
    """Everything the section draws of `report`, by part."""
    choices = prompt_choices(report)
    first = choices[0][1] if choices else (report.prompts[0].index if report.prompts else None)
    return {
        "summary": summary_html(report),
        "map": divergence_map(report),
        "noise": noise_vs_swing(report),
        "sweep": sweep_plot(report),
        "rounds": rounds_plot(report),
        "choices": choices,
        "first": first,
        "answers": answers_html(report, first) if first is not None else "",
        "positions": positions_plot(report),
    }


def prompt_choices(report: ProbeReport) -> list[tuple[str, int]]:
    """The dropdown: diverged or flagged prompts, worst first, at most MAX_MAP_PROMPTS."""
    flagged = [p for p in report.prompts if p.divergence is not None or p.findings or p.diverged_rounds]
    return [(f"#{p.index} {p.verdict}", p.index) for p in worst_first(flagged, MAX_MAP_PROMPTS)]


def _acceptance(a: Acceptance | None) -> str:
    if a is None:
        return "not reported"
    if a.rate is None:
        return "mean acceptance length " + (f"{a.mean_length:.2f}" if a.mean_length is not None else "n/a")
    return f"{a.rate:.2f} [{a.low or 0:.2f}, {a.high or 0:.2f}] of {a.drafted} drafted ({a.source})"


def summary_html(report: ProbeReport) -> str:
    """The report's summary as escaped HTML text (every string from the report through html_text):
    the verdict, what was compared, placeholders, acceptance, a collapse, the noise, next steps."""
    counts = ", ".join(f"{report.counts.get(v, 0)} {v}" for v in VERDICTS)
    a, b, n = report.side_a, report.side_b, report.noise
    lines = [
        f"<b>verdict: {html_text(report.verdict)}</b> ({len(report.prompts)} prompts: {counts}"
        + (f", {report.rounds} rounds" if report.rounds > 1 else "")
        + f"); {html_text(a.label)} against {html_text(b.label)} at concurrency {b.concurrency}",
        f"noise estimate {n.estimate:.2g} ({html_text(n.source)}): the largest shared-token margin change on prompts "
        "that do not stand out"
        + (f"; a prompt stands out when its median change exceeds {n.cut:.2g}" if n.cut is not None else "")
        + (f" or its largest {n.cut_max:.2g}" if n.cut_max is not None else ""),
    ]
    if n.calibration is not None:
        lines.append(
            f"calibration, {html_text(n.calibration.source)}: largest change {n.calibration.largest:.2g} "
            f"over {n.calibration.prompts} comparisons"
        )
    if n.batch_cut is not None and n.batch_cut_max is not None:
        lines.append(
            f"batch calibration (prompts as batches of copies of themselves): stands out above {n.batch_cut:.2g} "
            f"(median) or {n.batch_cut_max:.2g} (largest)"
        )
    if report.collapse is not None:
        lines.insert(1, f"<b>acceptance collapse</b>: {html_text(report.collapse.detail, 400)}")
    for side, name in ((a, "A"), (b, "B")):
        line = placeholder_line(side, name)
        if line:
            lines.append(html_text(line, 400))
    if a.acceptance is not None or b.acceptance is not None:
        lines.append(
            f"acceptance: side A {html_text(_acceptance(a.acceptance))}; side B {html_text(_acceptance(b.acceptance))}"
        )
    for name, acceptance in positions.shown(report):
        lines.append(
            f"acceptance per draft position, {html_text(name)}: "
            + html_text(positions.line(acceptance.positions), 1000)
        )
    if report.replay_command is not None:
        r = report.replay_command
        lines.append(f"replay offline under the watch: {html_text(r.command, 2000)} ({html_text(r.note, 800)})")
    lines += [f"next: {html_text(step, 600)}" for step in report.next_steps[:8]]
    return "".join(f"<p>{line}</p>" for line in lines)


LOCAL_PROBE: list[ProbeReport] = []  # `python app.py --probe PATH` (local only)


def open_local_probe(path: str | Path) -> ProbeReport:
    """`--probe PATH`: the report every new page shows open in this section (beside the trace
    `--trace` opens: a probe's replay trace). Refused in public mode, like `--trace`."""
    if serve.public_mode():
        raise SpecvizError("--probe opens a local file: refused in public mode (a Space reads no path a visitor chose)")
    LOCAL_PROBE[:] = [load_report(path)]  # size-capped and validated; a refusal is one line
    return LOCAL_PROBE[0]


def load_bundled_report(name: str | None) -> ProbeReport:
    if not name or name not in bundled_reports():  # only names from the list: no paths from the client
        raise SpecvizError("pick a bundled report first")
    return _parse((TRACES / name).read_bytes(), name)


def load_uploaded_report(path: str | None, session: str | None) -> ProbeReport:
    """`session`'s own uploaded report (see `specviz.app.uploads`), read once with a byte cap."""
    too_big = "{name}: over the {limit} MiB limit of a probe report"
    raw = uploads.read_upload(path, session, MAX_REPORT_UPLOAD_BYTES, too_big)
    return _parse(raw, Path(path or "").name, public=serve.public_mode())


def _parse(raw: bytes, name: str, public: bool = False) -> ProbeReport:
    try:
        payload = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SpecvizError(f"{name}: not a JSON file, so not a probe report") from None
    prompts = payload.get("prompts") if isinstance(payload, dict) else None
    if public and isinstance(prompts, list) and len(prompts) > PUBLIC_MAX_PROMPTS:
        raise SpecvizError(
            f"{name}: {len(prompts):,} prompts; this public app opens reports of at most {PUBLIC_MAX_PROMPTS:,} "
            "(open it in a local app: python app.py)"
        )
    try:
        return parse_report(payload, name)
    except ReportError as exc:
        raise SpecvizError(str(exc)) from None


def wire_probe(section: ProbeSection, user_errors: Any) -> None:
    """Open (bundled or uploaded) draws everything; picking a prompt redraws its answers."""
    outputs = [section.state, section.status, section.summary, section.map, section.noise, section.sweep]
    outputs += [section.rounds, section.prompt, section.answers, section.positions]
    guard = user_errors(section.status)

    section.open_bundled.click(guard(lambda name: section.show(load_bundled_report(name))), section.bundled, outputs)

    def open_upload(path: str | None, request: gr.Request) -> dict:
        return section.show(load_uploaded_report(path, getattr(request, "session_hash", None)))

    section.upload.upload(guard(open_upload), section.upload, outputs)

    def on_prompt(report: ProbeReport | None, index: int | None) -> dict:
        if report is None or index is None:
            return {section.answers: ""}
        return {section.answers: answers_html(report, int(index))}

    section.prompt.change(guard(on_prompt), [section.state, section.prompt], [section.answers])
