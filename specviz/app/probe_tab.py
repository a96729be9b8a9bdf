"""The server-probe section: opens a saved `specviz probe` report and draws it.

The app never probes anything itself: a visitor opens a bundled report (`traces/probe-*.json`) or
uploads one, so no URL reaches the server in any mode (a public Space must never connect to an
address a visitor chose). A report is untrusted input: read once with a byte cap, validated by
`specviz.probe.report.parse_report`, drawn by `specviz.views.probe` (escaped, bounded).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from specviz.app import uploads
from specviz.app.loading import DOCS, TRACES
from specviz.errors import SpecvizError
from specviz.probe.report import ProbeReport, ReportError, parse_report
from specviz.views.probe import answers_html, divergence_map, noise_vs_swing

MAX_REPORT_UPLOAD_BYTES = 8 * 1024 * 1024  # a report of 10,000 prompts is a few MB
PROBE_DOC_URL = f"/gradio_api/file={DOCS / 'probe.md'}"  # docs/ is a static path of the app


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
    prompt: Any
    answers: Any
    state: Any

    @classmethod
    def build(cls) -> ProbeSection:
        names = bundled_reports()
        with gr.Accordion("Server probe reports", open=False, elem_id="sv-probe"):
            gr.Markdown(
                "Open a report written by `specviz probe URL [URL_B] --out report.json` "
                f"([docs/probe.md]({PROBE_DOC_URL})): the same prompts sent alone and together, or to two "
                "servers, compared token by token. The app only opens reports; it never contacts a server."
            )
            with gr.Row(elem_id="sv-probe-open"):
                bundled = gr.Dropdown(names, value=names[0] if names else None, label="bundled report")
                open_bundled = gr.Button("open", variant="secondary")
                upload = gr.File(label="or upload a report (.json)", file_types=[".json"], type="filepath")
            status = gr.Markdown(elem_id="sv-probe-status")
            summary = gr.Markdown(elem_id="sv-probe-summary")
            with gr.Row(elem_id="sv-probe-plots"):
                map_plot = gr.Plot(label="where the answers part")
                noise_plot = gr.Plot(label="divergences against the noise")
            prompt = gr.Dropdown([], label="prompt", elem_id="sv-probe-prompt")
            answers = gr.HTML(elem_id="sv-probe-answers")
        return cls(bundled, open_bundled, upload, status, summary, map_plot, noise_plot, prompt, answers, gr.State())

    def show(self, report: ProbeReport) -> dict:
        diverged = [p.index for p in report.prompts if p.divergence is not None]
        first = diverged[0] if diverged else (report.prompts[0].index if report.prompts else None)
        return {
            self.state: report,
            self.status: "",
            self.summary: summary_markdown(report),
            self.map: divergence_map(report),
            self.noise: noise_vs_swing(report),
            self.prompt: gr.update(choices=[(f"#{i}", i) for i in diverged] or [], value=first),
            self.answers: answers_html(report, first) if first is not None else "",
        }


def summary_markdown(report: ProbeReport) -> str:
    counts = ", ".join(f"{report.counts.get(v, 0)} {v}" for v in ("identical", "numerical", "unattributed", "suspect"))
    return (
        f"**verdict: {report.verdict}** ({len(report.prompts)} prompts: {counts}); "
        f"{report.side_a.label} against {report.side_b.label}; noise estimate {report.noise.estimate:.2g} "
        f"({report.noise.source})"
    )


def load_bundled_report(name: str | None) -> ProbeReport:
    if not name or name not in bundled_reports():  # only names from the list: no paths from the client
        raise SpecvizError("pick a bundled report first")
    return _parse((TRACES / name).read_bytes(), name)


def load_uploaded_report(path: str | None, session: str | None) -> ProbeReport:
    """`session`'s own uploaded report (see `specviz.app.uploads`), read once with a byte cap."""
    too_big = "{name}: over the {limit} MiB limit of a probe report"
    raw = uploads.read_upload(path, session, MAX_REPORT_UPLOAD_BYTES, too_big)
    return _parse(raw, Path(path or "").name)


def _parse(raw: bytes, name: str) -> ProbeReport:
    try:
        payload = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SpecvizError(f"{name}: not a JSON file, so not a probe report") from None
    try:
        return parse_report(payload, name)
    except ReportError as exc:
        raise SpecvizError(str(exc)) from None


def wire_probe(section: ProbeSection, user_errors: Any) -> None:
    """Open (bundled or uploaded) draws everything; picking a prompt redraws its answers."""
    outputs = [section.state, section.status, section.summary, section.map, section.noise, section.prompt]
    outputs.append(section.answers)
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
