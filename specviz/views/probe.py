"""Views of a probe report (`specviz probe`): where the two sides' answers part, and why.

Pure functions of a `ProbeReport`, drawn like the trace views: the divergence map (prompts by
answer position: shared, then the first divergent token coloured by its verdict), the noise
estimate against each divergence's swing, a concurrency sweep (divergence rate and acceptance
against concurrency), the rounds (each prompt's divergence rate over --rounds), and one prompt's
two answers side by side at the point where they part. A report is untrusted input: every string
it carries is escaped, and what is drawn is bounded (`MAX_MAP_PROMPTS` rows and `MAX_MAP_TOKENS`
columns of the map; at most `MAX_MAP_PROMPTS` points or bars in the other plots, worst first).
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.probe.report import AFTER, DIVERGED, PAST_END, SHARED, VERDICTS, ProbeReport, PromptResult, position_kind
from specviz.views.safe_text import html_text

MAX_MAP_PROMPTS = 200  # rows of the map; a bigger report shows its first ones and says so
MAX_MAP_TOKENS = 512
MAX_POSITION_LINES = 17  # side A and at most 16 levels (specviz.probe.config.MAX_LEVELS)
VERDICT_COLORS = {
    "identical": "#d9d9d9",
    "numerical": "#74add1",
    "unattributed": "#fdae61",
    "suspect": "#b2182b",
}
# Cell codes of the map: the divergence map's codes, and the divergent cell recoded by verdict.
_SHARED_COLOR, _AFTER_COLOR, _PAST_COLOR = "#f0f0f0", "#bdbdbd", "#ffffff"
_CODES = ["past end", "shared", "after", "identical", "numerical", "unattributed", "suspect"]
_COLORS = [_PAST_COLOR, _SHARED_COLOR, _AFTER_COLOR, *VERDICT_COLORS.values()]


def divergence_map(report: ProbeReport) -> go.Figure:
    """Prompts (rows) by answer position (columns): where each pair of answers first differs."""
    prompts = report.prompts[:MAX_MAP_PROMPTS]
    width = min(MAX_MAP_TOKENS, max((max(p.length_a, p.length_b) for p in prompts), default=0))
    z, hover = [], []
    for p in prompts:
        row, text = [], []
        for j in range(width):
            code = _cell(p, j)
            row.append(code)
            text.append(f"prompt {p.index}, {p.unit} {j}: {_CODES[code]}")
        z.append(row)
        hover.append(text)
    n = len(_COLORS)
    scale = [[pos, color] for i, color in enumerate(_COLORS) for pos in (i / n, (i + 1) / n)]
    figure = go.Figure(
        go.Heatmap(
            z=z,
            zmin=-0.5,
            zmax=n - 0.5,
            colorscale=scale,
            showscale=False,
            hovertext=hover,
            hoverinfo="text",
            y=[f"#{p.index}" for p in prompts],
        )
    )
    shown = "" if len(report.prompts) <= MAX_MAP_PROMPTS else f" (first {MAX_MAP_PROMPTS} of {len(report.prompts)})"
    figure.update_layout(
        title=f"where the answers part: {_counts(report)}{shown}",
        xaxis_title=f"answer position ({prompts[0].unit if prompts else 'token'})",
        yaxis={"autorange": "reversed", "title": "prompt"},
        margin={"l": 50, "r": 10, "t": 40, "b": 40},
    )
    return figure


def _cell(p: PromptResult, j: int) -> int:
    """The colour code of prompt `p`'s position `j` (an index into `_CODES`)."""
    kind = position_kind(p, j)
    if kind == DIVERGED:
        return 3 + list(VERDICT_COLORS).index(p.verdict)
    return {PAST_END: 0, SHARED: 1, AFTER: 2}[kind]


def _counts(report: ProbeReport) -> str:
    return ", ".join(f"{report.counts.get(v, 0)} {v}" for v in VERDICT_COLORS)


def worst_first(prompts: list[PromptResult] | tuple[PromptResult, ...], limit: int) -> list[PromptResult]:
    """The `limit` prompts most worth a look: worst verdict, then most rounds diverged, then findings."""
    ranked = sorted(prompts, key=lambda p: (-VERDICTS.index(p.verdict), -p.diverged_rounds, -len(p.findings), p.index))
    return ranked[:limit]


def noise_vs_swing(report: ProbeReport) -> go.Figure:
    """Each divergence's swing (how far apart the two sides' choices are, in logprob) against the
    run's noise estimate: a divergence within the noise can be floating point; one far above it
    cannot."""
    figure = go.Figure()
    every = [p for p in report.prompts if p.divergence is not None and p.swing is not None]
    diverged = worst_first(every, MAX_MAP_PROMPTS)
    for verdict, color in VERDICT_COLORS.items():
        points = [p for p in diverged if p.verdict == verdict]
        if not points:
            continue
        figure.add_trace(
            go.Scatter(
                x=[p.index for p in points],
                y=[max(p.swing, 1e-9) for p in points],  # type: ignore[type-var]
                mode="markers",
                name=verdict,
                marker={"color": color, "size": 9, "line": {"width": 1, "color": "#444"}},
                hovertext=[html_text(f"#{p.index}: {p.reason}", 300) for p in points],
                hoverinfo="text",
            )
        )
    noise = report.noise.estimate
    figure.add_hline(
        y=max(noise, 1e-9),
        line_dash="dash",
        annotation_text=f"noise estimate {noise:.2g} ({html_text(report.noise.source, 20)})",
    )
    shown = "" if len(every) <= MAX_MAP_PROMPTS else f" (worst {MAX_MAP_PROMPTS} of {len(every)})"
    figure.update_layout(
        title=f"divergences against the noise{shown}",
        xaxis_title="prompt",
        yaxis={"type": "log", "title": "swing at the first divergent token (logprob)"},
        margin={"l": 60, "r": 10, "t": 40, "b": 40},
    )
    return figure


def sweep_plot(report: ProbeReport) -> go.Figure:
    """Per concurrency level: the share of prompts whose answer differs from level 1 (95% interval)
    and, where the server reported drafting, the acceptance rate; a collapse is marked."""
    figure = make_subplots(specs=[[{"secondary_y": True}]])
    levels = sorted(report.levels, key=lambda v: v.concurrency)[:MAX_MAP_PROMPTS]
    if not levels:
        figure.update_layout(title="no concurrency sweep in this report (specviz probe --concurrency 1,2,4,8,16)")
        return figure
    x = [v.concurrency for v in levels]
    figure.add_trace(
        go.Scatter(
            x=x, y=[v.rate for v in levels], mode="lines+markers", name="diverged from level 1",
            error_y={"type": "data", "symmetric": False, "array": [v.high - v.rate for v in levels],
                     "arrayminus": [v.rate - v.low for v in levels]},
            hovertext=[f"concurrency {v.concurrency}: {v.diverged} of {v.comparisons} diverged, "
                       + ", ".join(f"{v.counts.get(k, 0)} {k}" for k in VERDICTS) for v in levels],
            hoverinfo="text", marker={"color": VERDICT_COLORS["suspect"]},
        ),
        secondary_y=False,
    )  # fmt: skip
    rated = [(v, v.acceptance) for v in levels if v.acceptance is not None and v.acceptance.rate is not None]
    if rated:
        rates = [a.rate or 0.0 for _, a in rated]
        figure.add_trace(
            go.Scatter(
                x=[v.concurrency for v, _ in rated], y=rates, mode="lines+markers", name="acceptance rate",
                error_y={"type": "data", "symmetric": False,
                         "array": [(a.high or r) - r for (_, a), r in zip(rated, rates)],
                         "arrayminus": [r - (a.low or r) for (_, a), r in zip(rated, rates)]},
                marker={"color": VERDICT_COLORS["numerical"], "size": 10,
                        "symbol": ["x" if v.collapse else "circle" for v, _ in rated]},
                hovertext=[f"concurrency {v.concurrency}: acceptance {r:.2f}" + (" (collapse)" if v.collapse else "")
                           for (v, _), r in zip(rated, rates)],
                hoverinfo="text",
            ),
            secondary_y=True,
        )  # fmt: skip
    collapse = report.collapse
    title = "against concurrency" + (f": acceptance collapses at {collapse.concurrency}" if collapse else "")
    figure.update_layout(title=title, margin={"l": 60, "r": 60, "t": 40, "b": 40})
    figure.update_xaxes(title="concurrency", type="log", tickvals=x)
    figure.update_yaxes(title="prompts diverged from level 1", range=[0, 1.05], secondary_y=False)
    figure.update_yaxes(title="acceptance rate", range=[0, 1.05], secondary_y=True)
    return figure


def positions_plot(report: ProbeReport) -> go.Figure:
    """Acceptance at each draft position given the one before (95% intervals), one line per side
    or level that counted it: a depth that collapses under concurrency drops out of the others'
    intervals; the collapsed position is marked."""
    from specviz.probe.positions import shown

    figure = go.Figure()
    named = shown(report)[:MAX_POSITION_LINES]
    if not named:
        figure.update_layout(title="no acceptance per draft position in this report (vLLM /metrics, SGLang)")
        return figure
    collapse = report.collapse
    for name, acceptance in named:
        rows = [p for p in acceptance.positions[:MAX_MAP_TOKENS] if p.conditional is not None]
        values = [p.conditional or 0.0 for p in rows]
        figure.add_trace(
            go.Scatter(
                x=[p.position for p in rows], y=values, mode="lines+markers", name=html_text(name, 60),
                error_y={"type": "data", "symmetric": False,
                         "array": [(p.conditional_high or v) - v for p, v in zip(rows, values)],
                         "arrayminus": [v - (p.conditional_low or v) for p, v in zip(rows, values)]},
                hovertext=[html_text(f"{name}, position {p.position}: {p.accepted} of {p.given} accepted", 200)
                           for p in rows],
                hoverinfo="text",
            )
        )  # fmt: skip
    if collapse is not None and collapse.position is not None:
        figure.add_vline(x=collapse.position, line_dash="dash", annotation_text=f"collapse at {collapse.concurrency}")
    figure.update_layout(
        title="acceptance per draft position, given the position before",
        xaxis={"title": "draft position", "dtick": 1},
        yaxis={"title": "accepted, given the one before", "range": [0, 1.05]},
        margin={"l": 60, "r": 10, "t": 40, "b": 40},
    )
    return figure


def rounds_plot(report: ProbeReport) -> go.Figure:
    """Each prompt's share of rounds in which its answers differed (worst first, bounded): a
    prompt that diverged once in 20 rounds shows as a short bar, not as nothing."""
    figure = go.Figure()
    if report.rounds <= 1:
        figure.update_layout(title="one round in this report (specviz probe --rounds 20 finds rare divergences)")
        return figure
    shown = [p for p in worst_first(report.prompts, MAX_MAP_PROMPTS) if p.diverged_rounds]
    figure.add_trace(
        go.Bar(
            x=[f"#{p.index}" for p in shown],
            y=[p.diverged_rounds / max(p.rounds, 1) for p in shown],
            marker={"color": [VERDICT_COLORS[p.verdict] for p in shown]},
            hovertext=[html_text(f"#{p.index}: diverged in {p.diverged_rounds} of {p.rounds} rounds; {p.verdict}"
                                 + "".join(f"; {f.kind}: {f.detail}" for f in p.findings), 300) for p in shown],
            hoverinfo="text",
        )
    )  # fmt: skip
    figure.update_layout(
        title=f"prompts that diverged, over {report.rounds} rounds ({len(shown)} shown)",
        xaxis_title="prompt",
        yaxis={"title": "share of rounds diverged", "range": [0, 1.05]},
        margin={"l": 60, "r": 10, "t": 40, "b": 40},
    )
    return figure


def answers_html(report: ProbeReport, index: int) -> str:
    """Prompt `index`'s two answers where they part: the shared text, then each side's token."""
    p = next((q for q in report.prompts if q.index == index), None)
    if p is None:
        return "<p>no such prompt in this report</p>"
    head = f"<p><b>#{p.index}</b> {html_text(p.verdict)}: {html_text(p.reason, 400)}</p>"
    notes = []
    if p.rounds > 1:
        notes.append(f"diverged in {p.diverged_rounds} of {p.rounds} rounds (shown: round {p.round + 1})")
    if p.placeholders_a or p.placeholders_b:
        notes.append(
            f"placeholder tokens (drafted, no logprob): {p.placeholders_a} on side A, {p.placeholders_b} on side B"
        )
    notes += [f"{f.kind}: {f.detail}" for f in p.findings[:8]]
    head += "".join(f"<p>{html_text(n, 300)}</p>" for n in notes)
    if p.divergence is None or p.token_a is None or p.token_b is None:
        return head + "<p>the two answers are identical</p>"
    context = html_text(p.context, 200)
    sides = []
    for side, token in ((report.side_a, p.token_a), (report.side_b, p.token_b)):
        color = VERDICT_COLORS.get(p.verdict, "#b2182b")
        sides.append(
            f"<div class='probe-side'><div><b>{html_text(side.label)}</b></div>"
            f"<span>…{context}</span><mark style='background:{color}'>{html_text(repr(token.text), 60)}</mark></div>"
        )
    where = f"<p>first divergent {html_text(p.unit)}: {p.divergence}</p>"
    return head + where + "<div style='display:flex;gap:1em'>" + "".join(sides) + "</div>"
