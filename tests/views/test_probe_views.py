"""The probe report's views: the divergence map's cells follow the report's divergences and
verdicts, the noise plot carries the estimate, and a crafted report's strings are escaped."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from specviz.probe.report_read import load_report
from specviz.views.probe import MAX_MAP_PROMPTS, VERDICT_COLORS, answers_html, divergence_map, noise_vs_swing

EXAMPLE = Path(__file__).resolve().parents[2] / "traces" / "probe-example.json"


def test_divergence_map_marks_each_prompts_first_divergence_by_verdict() -> None:
    report = load_report(EXAMPLE)
    z = divergence_map(report).data[0].z
    verdict_codes = {v: 3 + i for i, v in enumerate(VERDICT_COLORS)}
    for p, row in zip(report.prompts, z):
        end = max(p.length_a, p.length_b)
        if p.divergence is None:
            assert all(code in (0, 1) for code in row)  # shared, then past the end
            assert row[: min(end, len(row))] == [1] * min(end, len(row))
        else:
            assert row[: p.divergence] == [1] * p.divergence
            assert row[p.divergence] == verdict_codes[p.verdict]


def test_noise_plot_shows_the_estimate_and_every_divergence() -> None:
    report = load_report(EXAMPLE)
    figure = noise_vs_swing(report)
    shown = sum(len(trace.x) for trace in figure.data)
    assert shown == sum(1 for p in report.prompts if p.divergence is not None and p.swing is not None)
    assert f"{report.noise.estimate:.2g}" in figure.layout.annotations[0].text


def test_answers_are_escaped_and_the_map_is_bounded() -> None:
    report = load_report(EXAMPLE)
    diverged = next(p for p in report.prompts if p.divergence is not None)
    evil = dataclasses.replace(
        diverged,
        reason="<script>x</script>",
        context="<img src=x>",
        token_a=dataclasses.replace(diverged.token_a, text="<b>"),
    )
    crafted = dataclasses.replace(report, prompts=(evil,) + tuple(report.prompts) * 30)
    html = answers_html(crafted, evil.index)
    assert "<script>" not in html and "<img" not in html and "&lt;img src=x&gt;" in html
    assert len(divergence_map(crafted).data[0].z) == MAX_MAP_PROMPTS
    assert "no such prompt" in answers_html(report, -5)
