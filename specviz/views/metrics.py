"""Acceptance metrics (defined in `specviz.analysis.metrics`) as a figure and tables, totals and per sequence."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.analysis.acceptance import Acceptance
from specviz.analysis.metrics import StepTotals, acceptance
from specviz.analysis.report import Report
from specviz.trace.schema import Trace

SEQUENCE_COLUMNS = [
    "seq",
    "verify steps",
    "drafted",
    "accepted",
    "acceptance rate",
    "mean acceptance length",
    "output tokens",
    "verdict",
    "first divergence (output position)",
]


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _acceptance(trace: Trace, totals: StepTotals | None) -> tuple[Acceptance, dict[int, Acceptance]]:
    """The run's acceptance: from `totals` when given (the check's walk gathered them), else a walk."""
    return (totals.acceptance, totals.per_seq) if totals is not None else acceptance(trace)


def acceptance_markdown(trace: Trace, totals: StepTotals | None = None) -> str:
    """Totals in words, with the definitions, so the numbers cannot be misread."""
    total, per_seq = _acceptance(trace, totals)
    if trace.header.draft_k == 0 or total.verify_steps == 0:
        return "No drafts in this run (plain greedy decoding): acceptance metrics do not apply."
    rates = [a.rate for a in per_seq.values() if a.rate is not None]
    spread = f"; per sequence {min(rates):.2f} … {max(rates):.2f}" if rates else ""
    positions = ", ".join(f"{p:.2f}" for p in total.per_position)
    given = ", ".join("n/a" if p is None else f"{p:.2f}" for p in total.per_position_given_previous)
    return (
        f"**acceptance rate** {_fmt(total.rate)} (accepted / drafted = {total.accepted} / {total.drafted}{spread})  \n"
        f"**mean acceptance length** {_fmt(total.mean_length, 2)} tokens per verify step (1 + accepted / verify "
        f"steps, the 1 is the bonus token)  \n"
        f"**acceptance per depth** [{positions}] (share of verify steps accepting at least i+1 drafts: a tree's "
        f"path reaching depth i+1; a head fed the wrong state collapses from depth 1)  \n"
        f"**acceptance given the previous depth** [{given}] (of the verify steps that accepted at least i "
        f"drafts, the share that accepted draft i+1 too: a bug in the later draft calls drops it from depth 2 "
        f"on, often only at batch > 1)  \n"
        f"**histogram** {total.histogram} (verify steps accepting exactly 0..{trace.header.draft_k} drafts)"
    )


def acceptance_figure(trace: Trace, totals: StepTotals | None = None) -> go.Figure:
    """Per-position acceptance and the acceptance-length histogram, side by side."""
    total, _ = _acceptance(trace, totals)
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(
            "Acceptance per depth (bars: ≥ i accepted; line: given ≥ i-1)",
            "Histogram: drafts accepted per verify step",
        ),
    )
    if total.verify_steps:
        positions = list(range(1, len(total.per_position) + 1))
        fig.add_trace(
            go.Bar(
                x=positions,
                y=total.per_position,
                marker_color="#4ade80",
                name="per position",
                hovertemplate="depth %{x}: %{y:.3f}<extra></extra>",
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Bar(
                x=list(range(len(total.histogram))),
                y=total.histogram,
                marker_color="#60a5fa",
                name="histogram",
                hovertemplate="%{x} accepted: %{y} verify steps<extra></extra>",
            ),
            row=1,
            col=2,
        )
        fig.add_trace(
            go.Scatter(
                x=positions,
                y=total.per_position_given_previous,
                mode="lines+markers",
                line_color="#15803d",
                name="given the previous depth",
                hovertemplate="depth %{x}, given the depth before it: %{y:.3f}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    fig.update_yaxes(range=[0, 1], row=1, col=1)
    fig.update_xaxes(title_text="depth i (draft position)", dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="accepted drafts", dtick=1, row=1, col=2)
    fig.update_layout(height=300, margin={"l": 10, "r": 10, "t": 50, "b": 40}, showlegend=False, plot_bgcolor="white")
    return fig


def sequence_table(trace: Trace, report: Report, totals: StepTotals | None = None) -> pd.DataFrame:
    """Per prompt: token-averaged totals hide short prompts, so each one gets its own line."""
    _, per_seq = _acceptance(trace, totals)
    verdicts = {s.seq_id: s for s in report.sequences}
    rows = []
    for seq in trace.sequences:
        acc = per_seq.get(seq.seq_id, Acceptance())
        verdict = verdicts.get(seq.seq_id)
        rows.append(
            (
                seq.seq_id,
                acc.verify_steps,
                acc.drafted,
                acc.accepted,
                round(acc.rate, 3) if acc.rate is not None else None,
                round(acc.mean_length, 2) if acc.mean_length is not None else None,
                len(seq.output_ids),
                verdict.verdict if verdict else "",
                verdict.first_divergence if verdict else None,
            )
        )
    return pd.DataFrame(rows, columns=SEQUENCE_COLUMNS)
