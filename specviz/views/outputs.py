"""Reference and speculative outputs side by side, per sequence, as an HTML string.

The reference is the target's plain greedy decoding at batch 1 (the oracle). Each speculative
column is compared token by token with its own run's reference: the common prefix is plain, the
first divergent token is solid red (and the reference's token at that index is marked), what
follows is faded, because after a divergence the rest is a different continuation, not more errors.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from specviz.analysis.report import Report, SequenceVerdict
from specviz.trace.naming import run_title
from specviz.trace.schema import SequenceRecord, Trace
from specviz.views.palette import verdict_badge
from specviz.views.tokens import token_label, token_texts

PER_PAGE = 8
PROMPT_CHARS = 240
# A page draws at most this many tokens per column and characters of recorded text: a sequence of
# a million tokens costs one page, not a million spans (the IDs and the rest stay in the file).
MAX_TOKENS_SHOWN = 1500
MAX_TEXT_CHARS = 8000
VERDICT_ORDER = {"desync": 0, "unexplained": 1, "numerical": 2, "unread": 3, "no-reference": 4, "exact": 5}

OUTPUTS_CSS = """
.sv-outputs { font-family: ui-sans-serif, system-ui, sans-serif; font-size: 14px; }
.sv-note { color: #475569; margin: 4px 0 10px; }
.sv-seq { border: 1px solid #e2e8f0; border-radius: 8px; padding: 8px 10px; margin-bottom: 10px; }
.sv-head { font-weight: 600; margin-bottom: 4px; }
.sv-prompt { color: #475569; font-size: 12px; margin-bottom: 6px; white-space: pre-wrap; }
.sv-cols { display: flex; gap: 10px; }
.sv-col { flex: 1 1 0; min-width: 0; }
.sv-col-title { font-size: 12px; font-weight: 600; color: #334155; margin-bottom: 3px; }
.sv-toks { line-height: 1.9; white-space: pre-wrap; word-break: break-word; }
.sv-tok { border-radius: 3px; padding: 1px 0; box-shadow: inset 0 0 0 1px #e2e8f0; }
.sv-tok.sv-div { background: #dc2626; color: #fff; font-weight: 700; box-shadow: 0 0 0 2px #7f1d1d; }
.sv-tok.sv-refdiv { background: #dcfce7; box-shadow: 0 0 0 2px #16a34a; font-weight: 700; }
.sv-tok.sv-after { background: #fef2f2; color: #9f1239; }
.sv-badge { display: inline-block; padding: 0 8px; border-radius: 10px; font-size: 12px; font-weight: 700; }
.sv-ids { font-family: ui-monospace, monospace; font-size: 11px; color: #64748b; word-break: break-all; }
.sv-ids b { color: #dc2626; }
.sv-plain { white-space: pre-wrap; margin-bottom: 4px; }
"""


@dataclass
class RunOutputs:
    """One run as the outputs view needs it."""

    label: str
    trace: Trace
    report: Report
    texts: dict[int, str] | None = None  # the run's piece table by ID, read once per loaded run

    def token_texts(self) -> dict[int, str]:
        """The piece table, read from the trace only when the caller did not pass it (then kept)."""
        if self.texts is None:
            self.texts = token_texts(self.trace)
        return self.texts


def ordered_sequence_ids(report: Report, only_diverged: bool = False) -> list[int]:
    """Divergent sequences first (desync before numerical), earliest divergence step first."""
    verdicts = [s for s in report.sequences if not only_diverged or s.first_divergence is not None]
    key = [
        (VERDICT_ORDER.get(s.verdict, 9), s.divergence_step if s.divergence_step is not None else 1 << 30, s.seq_id)
        for s in verdicts
    ]
    return [seq_id for *_, seq_id in sorted(key)]


def page_count(report: Report, per_page: int = PER_PAGE, only_diverged: bool = False) -> int:
    return max(1, math.ceil(len(ordered_sequence_ids(report, only_diverged)) / per_page))


def shown_range(length: int, divergence: int | None, limit: int = MAX_TOKENS_SHOWN) -> range:
    """Indices of the tokens a column draws: the first `limit`, or a stretch ending past the divergence."""
    start = 0
    if divergence is not None and divergence >= limit:
        start = max(0, min(divergence - limit // 10, length - limit))
    return range(start, min(length, start + limit))


def _elided(count: int, where: str) -> str:
    return f"<span class='sv-note'> … {count} token(s) {where} not shown … </span>" if count > 0 else ""


def _tokens_html(tokens: list[int], texts: dict[int, str], divergence: int | None, role: str) -> str:
    """`role` is "output" (red divergent token, faded rest) or "reference" (green marker)."""
    shown = shown_range(len(tokens), divergence)
    spans = [_elided(shown.start, "before")]
    for i in shown:
        token = tokens[i]
        classes = "sv-tok"
        if divergence is not None and i == divergence:
            classes += " sv-div" if role == "output" else " sv-refdiv"
        elif divergence is not None and i > divergence and role == "output":
            classes += " sv-after"
        attrs = f" data-index='{i}'" + (" data-divergent='true'" if i == divergence and role == "output" else "")
        text = html.escape(token_label(texts, token))
        spans.append(f"<span class='{classes}'{attrs} title='position {i} · token id {token}'>{text}</span>")
    spans.append(_elided(len(tokens) - shown.stop, "after"))
    if divergence is not None and divergence >= len(tokens):
        spans.append("<span class='sv-tok sv-div' data-divergent='true' title='output ends early'>⟂ ends</span>")
    return "".join(spans)


def _ids_html(tokens: list[int], divergence: int | None) -> str:
    shown = shown_range(len(tokens), divergence)
    parts = [f"<b>{tokens[i]}</b>" if i == divergence else str(tokens[i]) for i in shown]
    return (
        "<details><summary class='sv-ids'>token IDs</summary><div class='sv-ids'>"
        + " ".join(parts)
        + "</div></details>"
    )


def _column(
    title: str, tokens: list[int], texts: dict[int, str], divergence: int | None, role: str, plain: str = ""
) -> str:
    """`plain`: the recorded text, shown when the trace carries no per-token text."""
    text = f"<div class='sv-plain'>{html.escape(plain[:MAX_TEXT_CHARS])}</div>" if plain and not texts else ""
    return (
        f"<div class='sv-col' data-role='{role}'><div class='sv-col-title'>{title}</div>{text}"
        f"<div class='sv-toks'>{_tokens_html(tokens, texts, divergence, role)}</div>"
        f"{_ids_html(tokens, divergence)}</div>"
    )


def _token_words(tokens: list[int] | None, index: int, texts: dict[int, str]) -> str:
    """`id 262 'text'` for the token at `index`, or `none` past the end (the output ended early)."""
    if tokens is None or index >= len(tokens):
        return "none"
    token = tokens[index]
    text = f" {html.escape(repr(token_label(texts, token)))}" if token in texts else ""
    return f"id {token}{text}"


def _verdict_line(
    verdict: SequenceVerdict | None, seq: SequenceRecord | None = None, texts: dict[int, str] | None = None
) -> str:
    if verdict is None:
        return ""
    parts = [verdict_badge(verdict.verdict)]
    if verdict.first_divergence is not None:
        # A position in the output and two token IDs: said in words, never as two bare "#n".
        where = verdict.first_divergence
        parts.append(f"first divergence at output position {where}")
        if seq is not None:
            texts = texts or {}
            parts.append(
                f"output token {_token_words(seq.output_ids, where, texts)}, "
                f"reference token {_token_words(seq.reference_ids, where, texts)}"
            )
        if verdict.divergence_step is not None:
            parts.append(f"emitted at step {verdict.divergence_step}")
        if verdict.margin is not None:
            parts.append(f"reference margin {verdict.margin:.3g}")
    if verdict.first_violation_step is not None:
        parts.append(f"first violation at step {verdict.first_violation_step}")
    return " · ".join(parts)


def _sequence_card(seq: SequenceRecord, runs: list[RunOutputs]) -> str:
    base = runs[0]
    texts = base.token_texts()
    verdicts = [{v.seq_id: v for v in run.report.sequences}.get(seq.seq_id) for run in runs]
    first = verdicts[0]
    reference = seq.reference_ids
    prompt = seq.prompt if len(seq.prompt) <= PROMPT_CHARS else seq.prompt[:PROMPT_CHARS] + "…"
    head = f"seq {seq.seq_id} · {_verdict_line(first, seq, texts)}"
    columns = []
    if reference is not None:
        ref_div = first.first_divergence if first else None
        columns.append(_column("reference: target greedy, batch 1", reference, texts, ref_div, "reference"))
    else:
        columns.append("<div class='sv-col'><div class='sv-col-title'>reference</div>not recorded</div>")
    for run, verdict in zip(runs, verdicts):
        other_seq = _find(run.trace, seq.seq_id)
        if other_seq is None:
            continue
        title = f"run {html.escape(run.label)}: " if run.label else "run: "  # a report's one run has no slot
        title += html.escape(_run_name(run.trace))
        if run is not base and verdict is not None:
            title += " " + verdict_badge(verdict.verdict)
        divergence = verdict.first_divergence if verdict else None
        run_texts = run.token_texts() or texts
        columns.append(_column(title, other_seq.output_ids, run_texts, divergence, "output", other_seq.output_text))
    return (
        f"<div class='sv-seq' data-seq='{seq.seq_id}' data-verdict='{first.verdict if first else ''}'>"
        f"<div class='sv-head'>{head}</div>"
        f"<div class='sv-prompt'>prompt: {html.escape(prompt)}</div>"
        f"<div class='sv-cols'>{''.join(columns)}</div></div>"
    )


def _run_name(trace: Trace) -> str:
    return run_title(trace.header.method, trace.header.fault)


def _find(trace: Trace, seq_id: int) -> SequenceRecord | None:
    return next((s for s in trace.sequences if s.seq_id == seq_id), None)


def same_prompts(a: Trace, b: Trace) -> bool:
    """Two runs compare token for token only if they decoded the same prompt IDs."""
    return [(s.seq_id, s.prompt_ids) for s in a.sequences] == [(s.seq_id, s.prompt_ids) for s in b.sequences]


def outputs_html(
    main: RunOutputs,
    other: RunOutputs | None = None,
    page: int = 0,
    per_page: int = PER_PAGE,
    only_diverged: bool = False,
) -> str:
    """One page of sequence cards: reference | main run | other run (if it decoded the same prompts)."""
    order = ordered_sequence_ids(main.report, only_diverged)
    pages = max(1, math.ceil(len(order) / per_page))
    page = min(max(page, 0), pages - 1)
    runs = [main]
    note = ""
    if other is not None:
        if same_prompts(main.trace, other.trace):
            runs.append(other)
        else:
            note = f" Run {html.escape(other.label)} decoded other prompts, so it is not shown beside this one."
    diverged = sum(s.first_divergence is not None for s in main.report.sequences)
    header = (
        f"<div class='sv-note'>{diverged} of {len(main.report.sequences)} sequence(s) diverge from the reference; "
        f"divergent ones first. Page {page + 1} of {pages}. Red: first divergent token; faded: what follows it; "
        f"green: the reference's token at that place.{note}</div>"
    )
    wanted = order[page * per_page : (page + 1) * per_page]
    cards = [_sequence_card(seq, runs) for seq in (_find(main.trace, sid) for sid in wanted) if seq is not None]
    if not cards:
        cards = ["<div class='sv-note'>No sequence to show.</div>"]
    return f"<style>{OUTPUTS_CSS}</style><div class='sv-outputs'>{header}{''.join(cards)}</div>"
