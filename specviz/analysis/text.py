"""Human-readable report for `specviz check`."""

from __future__ import annotations

from specviz.analysis.check import CONTEXT_TOKENS
from specviz.analysis.metrics import summary, totals_of
from specviz.analysis.notes import run_notes
from specviz.analysis.report import Report, exact_read_note
from specviz.trace.naming import model_label, run_title
from specviz.trace.schema import Trace
from specviz.trace.token_text import token_label, token_texts

MAX_SEQUENCES_SHOWN = 20


def render_report(trace: Trace, report: Report) -> str:
    h = trace.header
    unread = report.unreadable
    lines = [
        f"verdict: {report.verdict.upper()}"
        + (f" (unreadable from step {unread['step']}: {unread['why']})" if unread is not None else ""),
        f"run: {run_title(h.method, h.fault)}, {len(trace.sequences)} prompts, "
        f"batch {trace.batch_rows}, k={h.draft_k}, "
        f"target {model_label(h.target.name)} ({h.target.dtype}, {h.target.device})"
        + (
            ""
            if h.complete
            else f"  [INCOMPLETE: read up to step {unread['step']}]"
            if unread is not None
            else "  [INCOMPLETE: run was interrupted]"
        ),
    ]
    lines += [f"note: {note}" for note in run_notes(trace, report)]
    if (partial := exact_read_note(report)) is not None:
        lines.append(f"exact match: {partial}")
    elif report.exact_match is not None:
        exact = sum(s.verdict == "exact" for s in report.sequences)
        lines.append(f"exact match: {report.exact_match:.3f} ({exact}/{len(report.sequences)} prompts token-identical)")
    else:
        lines.append("exact match: n/a (trace has no reference outputs)")
    v = report.first_violation
    if v is None:
        lines.append("invariants: all hold" + (f" on steps 0..{unread['step'] - 1}" if unread is not None else ""))
    else:
        lines.append(
            f"invariants: {report.violation_count} violation(s); first at step {v.step}, row {v.row}, "
            f"sequence {v.seq_id}: [{v.invariant} {v.name}] {v.message}"
        )
        lines.append(f"  field {v.field}: expected {v.expected}, actual {v.actual}")
        broken = sorted({(x.invariant, x.name) for x in report.violations})
        lines.append("  invariants broken: " + ", ".join(f"{i} {n}" for i, n in broken))
    for skipped in report.skipped_checks:
        lines.append(f"skipped: {skipped}")
    diverged = [s for s in report.sequences if s.first_divergence is not None]
    texts = token_texts(trace)
    if diverged:
        lines.append(f"divergences ({len(diverged)}):")
        for s in diverged[:MAX_SEQUENCES_SHOWN]:
            margin = f"{s.margin:.4g}" if s.margin is not None else "n/a"
            lines.append(
                f"  seq {s.seq_id}: output position {s.first_divergence} (step {s.divergence_step}) "
                f"{s.verdict}, reference margin {margin}"
            )
            at = s.first_divergence - max(0, s.first_divergence - CONTEXT_TOKENS)
            lines.append(f"    output:    {context_text(texts, s.context_output, at)}")
            lines.append(f"    reference: {context_text(texts, s.context_reference, at)}")
        if len(diverged) > MAX_SEQUENCES_SHOWN:
            lines.append(f"  ... and {len(diverged) - MAX_SEQUENCES_SHOWN} more (use --json)")
    totals = totals_of(trace, report.totals)  # one walk for every metric, if the check made none
    info = summary(trace, totals)
    total, per_seq = totals.acceptance, totals.per_seq
    if total.rate is not None:
        pos = ", ".join(f"{p:.2f}" for p in total.per_position)
        lines.append(
            f"acceptance: rate {total.rate:.3f}, mean length {total.mean_length:.2f}, "
            f"per position [{pos}], histogram {total.histogram}"
        )
        worst = sorted(per_seq.items(), key=lambda kv: kv[1].rate or 0)[:3]
        lines.append("  lowest per sequence: " + ", ".join(f"seq {sid} {a.rate:.2f}" for sid, a in worst))
    if info["tokens_per_second"]:
        lines.append(f"throughput: {info['tokens_per_second']:.1f} tok/s over {info['decode_seconds']:.2f} s")
    return "\n".join(lines)


def context_text(texts: dict[int, str], tokens: list[int], divergent: int) -> str:
    """Tokens around a divergence as text, the divergent one in brackets, then their IDs.

    Without a piece table in the trace (`header.token_text`) only the IDs can be shown.
    """
    ids = str(tokens)
    if not texts:
        return ids
    pieces = [token_label(texts, t) for t in tokens]
    if 0 <= divergent < len(pieces):
        pieces[divergent] = f"[{pieces[divergent]}]"
    return f"{''.join(pieces)!r}  ids {ids}"
