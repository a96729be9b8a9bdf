"""The summary header of a run and the A/B comparison table."""

from __future__ import annotations

import pandas as pd

from specviz.analysis.budgets import sequence_budgets
from specviz.analysis.metrics import summary, tokens_per_second, totals_of
from specviz.analysis.notes import run_notes
from specviz.analysis.report import Report, exact_read_note
from specviz.proposers import DEFAULT_PROPOSER
from specviz.trace import naming
from specviz.trace.schema import Trace
from specviz.views.palette import verdict_badge
from specviz.views.safe_text import html_text, md_text, plain_text
from specviz.views.skipped import skipped_lines

VERDICT_MEANING = {
    "clean": "every invariant holds and every output equals the target's greedy reference",
    "numerical": "no invariant broke; outputs differ only at floating-point near-ties",
    "unexplained": "an output differs, with no broken invariant and no near-tie to explain it",
    "desync": "the engine fed a state that differs from the correct one",
    "unreadable": "the watch could not tell which sequence the engine's rows held from some step on: not judged there",
}


def run_title(trace: Trace) -> str:
    """The run's name for Markdown: method and fault come from the file, so they are escaped."""
    return md_text(naming.run_title(trace.header.method, trace.header.fault)) + (
        f" · engine {md_text(trace.header.engine)}" if trace.header.engine != "specviz" else ""
    )


def _exact(report: Report) -> str:
    if (partial := exact_read_note(report)) is not None:
        return partial
    if report.exact_match is None:
        return "n/a (no reference recorded)"
    exact = sum(s.verdict == "exact" for s in report.sequences)
    return f"{exact}/{len(report.sequences)} ({report.exact_match:.0%})"


def _rate(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def desync_sentence(report: Report) -> str:
    """Where desynchronisation begins, in one line (empty for a run with no violation)."""
    v = report.first_violation
    if v is None:
        return ""
    return (
        f"**Desync begins at step {v.step}, row {v.row} (sequence {v.seq_id})**: invariant {v.invariant} "
        f"*{md_text(v.name)}*: {md_text(v.message, 600)}" + ("" if v.message.endswith((".", "?")) else ".")
    )


def model_name(name: str) -> str:
    """A model's name for display: a local path shows its last two parts, never the machine's folders."""
    parts = [part for part in str(name).replace("\\", "/").split("/") if part]
    if str(name).startswith(("/", "~", ".")) or (len(str(name)) > 2 and str(name)[1] == ":"):
        return "…/" + "/".join(parts[-2:]) if len(parts) > 2 else "/".join(parts)
    return str(name)


def _nowrap(text: str) -> str:
    """A name (model, file) that must not break at its hyphens or slashes; escaped."""
    return f"<span class='sv-nowrap'>{md_text(text)}</span>"


def stats_line(trace: Trace, report: Report) -> str:
    """The run's numbers on one line that wraps between items, never inside one (no table: on a
    phone or in a half-width panel a five-column table is wider than its panel)."""
    # The check's walk gathered the sums (`report.totals`): no second walk of the steps, which for
    # a Parquet trace opened lazily is every row group read again (seconds at a million row-steps).
    totals = totals_of(trace, report.totals)
    total = totals.acceptance
    speed = tokens_per_second(trace)  # not `summary`: its per-sequence divergences are not shown here
    items = [
        f"exact match **{_exact(report)}**",
        f"acceptance rate **{_rate(total.rate)}**",
        f"mean acceptance length **{_rate(total.mean_length)}**",
        f"**{f'{speed:.0f}' if speed else 'n/a'}** tokens/s",
        f"**{report.violation_count}** violation{'s' if report.violation_count != 1 else ''}",
    ]
    return " · ".join(items)


def summary_markdown(trace: Trace, report: Report, label: str = "") -> str:
    h = trace.header
    prefix = f"Run {label}: " if label else ""
    lines = [f"### {prefix}{run_title(trace)} · {verdict_badge(report.verdict)}"]
    if not h.complete and report.unreadable is None:  # an unreadable run says where, below
        lines.append("⚠️ **Incomplete run**: it was interrupted; steps and outputs hold only what finished.")
    # The verdict first, in words: what a stranger needs before any number.
    lines.append(f"*{VERDICT_MEANING.get(report.verdict, '')}*  \n{stats_line(trace, report)}")
    sentence = desync_sentence(report)
    if sentence:
        lines.append(sentence)
    elif report.verdict == "numerical":
        lines.append("No invariant broke: divergences sit on near-ties of the reference's logits.")
    # Where the numbers mislead: a DESYNC beside exact outputs, a fault that never fired.
    lines += [f"⚠️ *{md_text(note[0].upper() + note[1:], 400)}.*" for note in run_notes(trace, report)]
    if report.unreadable is not None:
        where = report.unreadable["step"]
        lines.append(f"**Unreadable from step {int(where)}**: {md_text(report.unreadable['why'], 300)}")
    lines.extend(_not_checked(report))
    draft = f", draft {_nowrap(model_name(h.draft.name))}" if h.draft else ""
    if h.draft_k and h.proposer != DEFAULT_PROPOSER:  # schema 3: another proposer drafted (a head, n-gram lookup)
        draft += f", drafts by {md_text(h.proposer)}"
    if h.tree_branches:
        draft += f", tree ({h.tree_branches} alternatives)"
    lines.append(
        f"<sub>target {_nowrap(model_name(h.target.name))} ({md_text(h.target.dtype)}, {md_text(h.target.device)})"
        f"{draft} · k={h.draft_k} · batch {trace.batch_rows}"
        f" · {len(trace.sequences)} prompts × {new_tokens(trace)} new tokens · {len(trace.steps)} steps</sub>"
    )
    return "\n\n".join(lines)


def new_tokens(trace: Trace) -> str:
    """The run's budget, or the range of the sequences' own budgets where they differ ("4–10")."""
    budgets = sequence_budgets(trace.header, (s.seq_id for s in trace.sequences)).values()
    low, high = min(budgets, default=trace.header.max_new_tokens), max(budgets, default=trace.header.max_new_tokens)
    return str(low) if low == high else f"{low}–{high}"


def _not_checked(report: Report) -> list[str]:
    """The checks the trace gave no fields for, under the verdict (a check that could not run is
    not a pass), folded to one line so the grid stays on the first screen."""
    lines = skipped_lines(report)
    if not lines:
        return []
    items = "".join(f"<li>{html_text(line, 300)}</li>" for line in lines)
    noun = "check" if len(lines) == 1 else "checks"
    return [f"<details><summary>{len(lines)} {noun} not run on some or all steps</summary><ul>{items}</ul></details>"]


def _first_violation_cell(report: Report) -> str:
    v = report.first_violation
    return f"step {v.step}, row {v.row}, seq {v.seq_id}" if v else "none"


def compare_table(runs: list[tuple[str, Trace, Report]]) -> pd.DataFrame:
    """Metric per column run. Throughput is per run; a speedup is only meaningful within one run."""
    metrics: dict[str, list[str]] = {}
    for _, trace, report in runs:
        info = summary(trace, totals_of(trace, report.totals))
        values = {
            "run": plain_text(naming.run_title(trace.header.method, trace.header.fault)),  # a table cell: one line
            "verdict": report.verdict,
            "exact match": _exact(report),
            "violations": str(report.violation_count),
            "first violation": _first_violation_cell(report),
            "acceptance rate": _rate(info["acceptance_rate"], 3),
            "mean acceptance length": _rate(info["mean_acceptance_length"]),
            "tokens/s": _rate(info["tokens_per_second"], 1),
            "steps": str(info["steps"]),
            "prompts × new tokens": f"{info['num_prompts']} × {new_tokens(trace)}",
            "batch, k": f"{info['batch_size']}, {info['draft_k']}",
        }
        for key, value in values.items():
            metrics.setdefault(key, []).append(value)
    columns = ["metric"] + [f"run {label}" for label, _, _ in runs]
    rows = [[key, *values] for key, values in metrics.items()]
    if len(runs) == 2:  # first: whether the two can be compared output by output at all
        rows.insert(0, ["prompts in common", *shared_prompts_cells(runs[0][1], runs[1][1])])
    return pd.DataFrame(rows, columns=columns)


def shared_prompts_cells(a: Trace, b: Trace) -> list[str]:
    """How many of each run's prompts the other decoded too; says so when they share none (their
    outputs cannot be set side by side, only their numbers)."""
    prompts_a = {s.prompt for s in a.sequences}
    prompts_b = {s.prompt for s in b.sequences}
    common = len(prompts_a & prompts_b)
    if not common:
        none = "none: different prompts (compare these numbers only, not outputs)"
        return [none, none]
    return [f"{common} of {len(prompts_a)}", f"{common} of {len(prompts_b)}"]
