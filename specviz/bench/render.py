"""Rendering a `BenchResult`: the markdown report, the CSV of cells, the plots, and the output folder.

Reads results only; nothing here measures.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from specviz.bench.results import GOAL_ALIGNMENT_SHARE, BenchResult, Cell
from specviz.bench.settings import EXSPEC_POLICY

# (header, Cell field, format) for the markdown table; shares print as percentages.
TABLE = (
    ("arm", "arm", "{}"),
    ("batch", "batch_size", "{}"),
    ("k", "draft_k", "{}"),
    ("exact", "exact_match", "{:.3f}"),
    ("diverged", "diverged", "{}"),
    ("first div min/med", None, ""),
    ("verdict", "verdict", "{}"),
    ("acc rate", "acceptance_rate", "{:.3f}"),
    ("mean acc len", "mean_acceptance_length", "{:.2f}"),
    ("tok/s", "tokens_per_second", "{:.1f}"),
    ("speedup", "speedup_vs_baseline", "{:.2f}x"),
    ("draft %", "draft_share", "{:.1%}"),
    ("verify %", "verify_share", "{:.1%}"),
    ("align %", "alignment_share", "{:.1%}"),
    ("bookkeeping %", "bookkeeping_share", "{:.1%}"),
    ("step ms", "step_ms", "{:.2f}"),
    ("rows/step", "rows_per_step", "{:.2f}"),
    ("group share", "group_share", "{:.1%}"),
    ("full groups", "full_group_share", "{:.1%}"),
)


def _format_cell(cell: Cell, name: str | None, pattern: str) -> str:
    if name is None:
        if cell.first_divergence_min is None:
            return "-"
        return f"{cell.first_divergence_min}/{cell.first_divergence_median:g}"
    value = getattr(cell, name)
    return "-" if value is None else pattern.format(value)


def markdown_table(cells: list[Cell]) -> str:
    lines = ["| " + " | ".join(h for h, _, _ in TABLE) + " |", "|" + "---|" * len(TABLE)]
    for cell in cells:
        lines.append("| " + " | ".join(_format_cell(cell, n, p) for _, n, p in TABLE) + " |")
    return "\n".join(lines)


def _tracing_goal_line(label: str, goal: dict[str, Any], verdict: Any) -> str:
    how = goal.get("measured")
    detail = f", timed {how}; interleaved median {_pct(goal.get('interleaved'))}" if how == "inside the runs" else ""
    return f"- {label}: {_pct(goal['value'])}{detail} (goal {goal['goal']}): {verdict(goal['met'])}"


def _goal_lines(goals: dict[str, Any]) -> list[str]:
    def verdict(met: bool | None) -> str:
        return "not measured" if met is None else ("met" if met else "NOT met")

    align = goals["alignment_share_batched_move"]
    tracing = goals["tracing_overhead"]
    grouping = goals["exspec_grouping"]
    lines = [
        f"- alignment share, eqspec batched move at batch {align['batch_size']}: "
        f"{_pct(align['value'])} (goal {align['goal']}): {verdict(align['met'])}",
        _tracing_goal_line("tracing overhead", tracing, verdict),
    ]
    for name, goal in goals.get("tracing_overhead_by_arm", {}).items():
        lines.append(_tracing_goal_line(f"tracing overhead, {name}", goal, verdict))
    inplace = goals.get("inplace_alignment_share", {})
    if inplace.get("met") is not None:
        lines.append(
            f"- alignment share, inplace at batch {inplace['batch_size']}: {_pct(inplace['value'])} "
            f"(goal {inplace['goal']}): {verdict(inplace['met'])}"
        )
    ex_align = goals.get("exspec_alignment_vs_eqspec", {})
    if ex_align.get("met") is not None:
        lines.append(
            f"- alignment ms/step at batch {ex_align['batch_size']}: exspec {ex_align['exspec_align_ms_per_step']:.2f} "
            f"vs eqspec {ex_align['eqspec_align_ms_per_step']:.2f} (goal {ex_align['goal']}): "
            f"{verdict(ex_align['met'])}"
        )
    watch = goals.get("watch_overhead", {})
    if watch.get("met") is not None:
        lines.append(f"- watch overhead: {_pct(watch['value'])} (goal {watch['goal']}): {verdict(watch['met'])}")
    if grouping.get("met") is not None:
        lines.append(
            f"- exspec at batch {grouping['batch_size']}: group share {_pct(grouping['group_share'])}, "
            f"{grouping['exspec_tokens_per_second']:.1f} tok/s vs eqspec {grouping['eqspec_tokens_per_second']:.1f}, "
            f"exact {grouping['exact_match']:.3f} ({grouping['goal']}): {verdict(grouping['met'])}; "
            f"on {grouping['num_prompts']} prompts (lengths converge only among many prompts: the issue's "
            "setting is all 480, benchmarks/exspec_grouping.py)"
        )
    return lines


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def render_markdown(result: BenchResult) -> str:
    s, m = result.settings, result.machine
    tracing = result.tracing
    lines = [
        "# specviz bench",
        "",
        f"- date: {result.started_at} to {result.finished_at}",
        f"- command: `{result.command}`",
        f"- machine: {m['processor']}, {m['cpu_count']} cores, torch threads {m['torch_threads']}, "
        f"device {m.get('device_name', m['device'])}, {m['dtype']}; torch {m['torch']}, transformers "
        f"{m['transformers']}; load average {m['load_average_start']} -> {m.get('load_average_end')}",
        f"- models: target {m['target']}, draft {m['draft']}",
        f"- prompts: {result.prompts['count']} SpecBench ({s.split}) prompts spread over the categories, "
        f"{result.prompts['prompt_tokens_mean']} tokens on average (max {result.prompts['prompt_tokens_max']}), "
        f"{result.prompts['skipped_too_long']} too long for the target left out; max new tokens {s.max_new_tokens}",
        f"- timing: warm ({result.timing['warm_up']}), {len(s.timed_repeats)} timed repeats",
        f"- {s.repeats} repeats, arms interleaved; speedup = median over repeats of tok/s / baseline tok/s "
        f"(same batch size, same repeat); EXSPEC window = {s.window_factor} x batch; "
        f"exspec arm policy `{EXSPEC_POLICY}`",
        "",
        "## Results",
        "",
        markdown_table(result.cells),
        "",
        "## Tracing overhead",
        "",
    ]
    for tracing in result.tracing_by_arm.values() or ([result.tracing] if result.tracing else []):
        lines.append(
            f"- {tracing.arm}, batch {tracing.batch_size}, k={tracing.draft_k}, {len(tracing.seconds_on)} interleaved "
            f"pairs: median on/off - 1 = {_pct(tracing.overhead)}, fastest on / fastest off - 1 = "
            f"{_pct(tracing.overhead_of_fastest)} (on {_seconds(tracing.seconds_on)}, "
            f"off {_seconds(tracing.seconds_off)})"
            + (
                f"; timed inside the recorder-on runs: {_pct(tracing.overhead_inside)} of the rest of decode "
                "(recording and the KV-content check)"
                if tracing.overhead_inside is not None
                else ""
            )
        )
    if tracing is None:
        lines.append("not measured")
    watched = result.watch
    if watched is not None:  # only with the eqspec-watched arm
        lines += [
            "",
            "## Watch overhead (specviz.watch, recorder off in both)",
            "",
            f"{watched.arm} vs the same run unwatched, batch {watched.batch_size}, k={watched.draft_k}, "
            f"{len(watched.seconds_on)} interleaved pairs: median watched/unwatched - 1 = {_pct(watched.overhead)}, "
            f"fastest/fastest - 1 = {_pct(watched.overhead_of_fastest)} (watched {_seconds(watched.seconds_on)}, "
            f"unwatched {_seconds(watched.seconds_off)})",
        ]
    shares = result.group_shares()
    lines += ["", f"## EXSPEC group share (batch {result.grouping_batch}, window {result.grouping_window})", ""]
    lines += [f"- {arm}: {_pct(share)}" for arm, share in shares.items()] or ["no exspec arm"]
    lines += ["", "## Goals", "", *_goal_lines(result.goals()), ""]
    return "\n".join(lines)


def _seconds(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "] s"


def write_csv(cells: list[Cell], path: Path) -> None:
    """One row per cell, every field but the per-prompt divergence list."""
    import csv

    names = [f.name for f in fields(Cell) if f.name != "first_divergence"]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=names)
        writer.writeheader()
        for cell in cells:
            row = asdict(cell)
            writer.writerow({n: row[n] for n in names})


def _series(result: BenchResult, field_name: str, scale: float = 1.0) -> dict[str, tuple[list[int], list[float]]]:
    """Per arm at the primary draft length: (batch sizes, values)."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for cell in result.cells:
        if cell.draft_k not in (0, result.settings.primary_k):
            continue
        xs, ys = out.setdefault(cell.arm, ([], []))
        xs.append(cell.batch_size)
        ys.append(getattr(cell, field_name) * scale)
    return out


def _line_figure(result: BenchResult, field_name: str, title: str, y_title: str, scale: float = 1.0) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for arm, (xs, ys) in _series(result, field_name, scale).items():
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=arm))
    fig.update_xaxes(type="log", tickvals=list(result.settings.batch_sizes), title="batch size")
    fig.update_layout(title=title, yaxis_title=y_title, template="plotly_white", height=420)
    return fig


def _phase_figure(result: BenchResult) -> Any:
    import plotly.graph_objects as go

    cells = [c for c in result.cells if c.draft_k in (0, result.settings.primary_k)]
    labels = [f"{c.arm} b{c.batch_size}" for c in cells]
    fig = go.Figure()
    for phase, name in (("draft", "draft"), ("verify", "verify"), ("alignment", "align"), ("bookkeeping", "other")):
        values = [getattr(c, f"{phase}_share") * 100 for c in cells]
        fig.add_trace(go.Bar(x=labels, y=values, name=name))
    fig.update_layout(
        barmode="stack", title="Step time split", yaxis_title="% of step time", template="plotly_white", height=480
    )
    return fig


def figures(result: BenchResult) -> dict[str, Any]:
    k = result.settings.primary_k
    alignment = _line_figure(
        result, "alignment_share", f"Alignment share of step time vs batch size (k={k})", "% of step time", 100
    )
    alignment.add_hline(y=GOAL_ALIGNMENT_SHARE * 100, line_dash="dash", annotation_text="5% goal")
    return {
        "alignment_share": alignment,
        "tokens_per_second": _line_figure(result, "tokens_per_second", f"Throughput (k={k})", "tokens/s"),
        "speedup": _line_figure(result, "speedup_vs_baseline", f"Speedup vs batched baseline (k={k})", "x baseline"),
        "phases": _phase_figure(result),
    }


def write_plots(result: BenchResult, out: Path, plotlyjs: str = "inline") -> list[Path]:
    """One HTML page (plotly.js inlined once, or loaded from its CDN); PNGs too when kaleido is installed."""
    figs = figures(result)
    first: bool | str = True if plotlyjs == "inline" else "cdn"
    parts = [
        fig.to_html(full_html=False, include_plotlyjs=first if i == 0 else False, default_height=fig.layout.height)
        for i, fig in enumerate(figs.values())
    ]
    page = out / "plots.html"
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>specviz bench</title></head><body>"
        + "".join(parts)
        + "</body></html>",
        encoding="utf-8",
    )
    paths = [page]
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return paths
    for name, fig in figs.items():
        png = out / f"{name}.png"
        fig.write_image(png)
        paths.append(png)
    return paths


def write_outputs(result: BenchResult, out: Path, plotlyjs: str = "inline") -> list[Path]:
    """results.csv, results.md, results.json and the plots under `out`; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path, json_path = out / "results.csv", out / "results.md", out / "results.json"
    write_csv(result.cells, csv_path)
    md_path.write_text(render_markdown(result), encoding="utf-8")
    json_path.write_text(json.dumps(result.to_json(), indent=1), encoding="utf-8")
    return [csv_path, md_path, json_path, *write_plots(result, out, plotlyjs)]
