"""Invariant checks and divergence attribution: pure functions of a trace, no models needed.

The walk: for each step, every row is checked against the history of the sequences as written so
far (`row_checks`, `recorded`), then the step's writes are applied (`History.apply_write`) and the
endings checked (`finish`); at the end, each sequence's output against what the steps wrote, then
the verdicts. The invariants are `specviz.trace.invariants.Invariant`; docs/forensics.md lists
every check. Expected values are derived here from the trace's own token history, never copied
from the engine's `*_expected` fields, so an engine cannot vouch for itself.
"""

from __future__ import annotations

from specviz.analysis.arrays import Columns, step_slices
from specviz.analysis.columnar import check_clean_steps
from specviz.analysis.exactness import exact_match, exact_match_read, sequence_divergence
from specviz.analysis.findings import Findings, stub_row, unreadable_from
from specviz.analysis.finish import FinishChecks
from specviz.analysis.history import History
from specviz.analysis.metrics import StepTotals, TotalsRules, add_columns, add_step, settle
from specviz.analysis.prefill_checks import check_prefill_row
from specviz.analysis.recorded import check_recorded_row, note_unrecorded
from specviz.analysis.report import Report, SequenceVerdict, Violation
from specviz.analysis.row_checks import check_accounting, check_alignment, check_kv, check_positions
from specviz.analysis.tree_checks import check_head_row, check_tree_row
from specviz.analysis.unread import read_as_greedy
from specviz.trace.invariants import Invariant
from specviz.trace.schema import SequenceRecord, StepRecord, Trace

# Reference top-1 minus top-2 logit below which a flip counts as a floating-point near-tie.
# Calibrated (tools/calibrate_margins.py, data in docs/margin-calibration.json, table in
# docs/forensics.md): batched-versus-batch-1 noise on the top-1 minus top-2 margin, at positions
# where both agree, of the default and the tiny test target on CPU. Each threshold is twice the
# largest noise measured, rounded up to a power of two (the noise comes in units of the dtype's
# spacing): float32 5e-6 -> 2**-16, float16 2**-7 -> 2**-6, bfloat16 2**-4 -> 2**-3. float64
# showed no noise; 1e-6 is a floor. A threshold far above the noise would call every divergence
# "numerical" whatever its cause (issue 26).
MARGIN_THRESHOLDS = {"float64": 1e-6, "float32": 2.0**-16, "float16": 2.0**-6, "bfloat16": 2.0**-3}
DEFAULT_MARGIN_THRESHOLD = MARGIN_THRESHOLDS["float32"]
CONTEXT_TOKENS = 4
REJECTION_NOTE = (
    "output equivalence",
    "rejection sampling is distribution-exact, not token-exact (specviz.analysis.distribution tests it)",
)


def margin_threshold_for(trace: Trace) -> float:
    """The dtype's logit threshold; at temperature T > 0 margins are of noisy scores (logits / T +
    noise), where a logit error e moves a score by e / T, so the threshold scales by 1 / T."""
    threshold = MARGIN_THRESHOLDS.get(trace.header.target.dtype, DEFAULT_MARGIN_THRESHOLD)
    sampling = trace.header.sampling
    if sampling is not None and sampling.mode != "greedy" and sampling.temperature > 0:
        threshold /= sampling.temperature
    return threshold


def check_trace(trace: Trace, margin_threshold: float | None = None) -> Report:
    """Check every invariant on every row of every step, then judge each sequence and the run.

    `margin_threshold`: the near-tie threshold of the verdicts (default: the target dtype's,
    `margin_threshold_for`). Never raises on a trace that loaded; checks whose fields the trace
    lacks are listed in `Report.skipped_checks`.
    """
    threshold = margin_threshold if margin_threshold is not None else margin_threshold_for(trace)
    findings = Findings()
    history = History(trace)
    sampling = trace.header.sampling
    if sampling is not None and sampling.mode == "rejection":
        # The engine records what it sampled (accepted drafts, then its residual or bonus
        # sample), so accounting still holds; agreement with an oracle cannot be asked.
        findings.skip(*REJECTION_NOTE)
    finish = FinishChecks(findings, history)
    _watch_tokens(history)
    totals = _walk(trace, findings, history, finish)
    check_outputs(findings, history)
    finish.check_run()
    note_unrecorded(findings, trace.header)
    findings.note_unfollowed(trace.header.options)
    violations = sorted(findings.violations, key=lambda v: (v.step_index, v.row, v.invariant))
    unreadable = unreadable_from(trace.header.options, len(trace.steps))
    unread = unreadable is not None
    sequences = [_sequence_verdict(findings, history, seq, threshold, unread) for seq in trace.sequences]
    return Report(
        verdict=_run_verdict(violations, sequences, unreadable is not None),
        violations=violations,
        sequences=sequences,
        exact_match=exact_match(trace),
        margin_threshold=threshold,
        skipped_checks=findings.skipped_checks(len(trace.steps)),
        violation_count=findings.count,
        totals=totals,
        unreadable=unreadable,
        exact_match_read=exact_match_read(trace) if unreadable is not None else None,
        read_as_greedy=_read_as_greedy(trace),
    )


def _read_as_greedy(trace: Trace) -> dict[str, int] | None:
    sequences, tokens = read_as_greedy(trace.header.options)
    return {"sequences": sequences, "tokens": tokens} if sequences else None


def _walk(trace: Trace, findings: Findings, history: History, finish: FinishChecks) -> StepTotals:
    """Every step in order, row by row; a Parquet trace's row groups a column at a time up to their
    first step that some check would flag, the rest of the group row by row (`columnar`). The
    metrics' sums are gathered on the way (one read of each row group for both)."""
    rules, totals = TotalsRules.of(trace), StepTotals()
    groups = getattr(trace.steps, "column_groups", None)
    if groups is None:
        for si, step in enumerate(trace.steps):
            _check_step_and_finish(findings, history, finish, si, step)
            add_step(totals, step, rules)
        return totals
    for first, table, decode in groups():
        for offset, part in step_slices(table):
            columns = Columns.of(part)
            clean = 0  # columns the arrays cannot take: the whole slice row by row
            if columns is not None:
                clean, total = check_clean_steps(columns, first + offset, findings, history, finish)
                if clean == total:
                    add_columns(totals, part, columns, rules)
                    continue
            rest = decode()[offset:]  # the rest of the group row by row
            for si, step in enumerate(rest[clean:], first + offset + clean):
                _check_step_and_finish(findings, history, finish, si, step)
            for step in rest:
                add_step(totals, step, rules)
            break
    settle(totals)
    return totals


def _check_step_and_finish(
    findings: Findings, history: History, finish: FinishChecks, si: int, step: StepRecord
) -> None:
    history.step_numbers.append(step.step)
    check_step(findings, history, si, step)
    finish.check_step(si, step)


def _watch_tokens(history: History) -> None:
    """The output tokens whose writing step the verdicts and `check_outputs` will ask for."""
    complete = history.trace.header.complete
    for seq in history.trace.sequences:
        state = history.seqs[seq.seq_id]
        if len(seq.output_ids) > state.budget:
            state.watch(state.budget)
        eos_at = early_eos(seq.output_ids, history.eos)
        if eos_at is not None:
            state.watch(eos_at + 1)
        index = sequence_divergence(seq, complete)
        if index is not None:
            state.watch(index)


def check_step(findings: Findings, history: History, si: int, step: StepRecord) -> None:
    """Every row against the history before the step; then the step's writes are applied."""
    widths = set()
    seen_seqs: set[int] = set()
    for row in step.rows:
        flag = findings.at(si, step, row)
        if row.seq_id in seen_seqs:
            flag(
                Invariant.ACCOUNTING,
                "seq_id",
                "each sequence in one row",
                row.seq_id,
                f"sequence {row.seq_id} appears in two rows of one step",
            )
        seen_seqs.add(row.seq_id)
        runs = [run for run in row.mask_rle if run[1] > 0]
        if row.mask_rle:  # empty: not recorded, so no width to compare
            widths.add(sum(run[1] for run in runs))
        check_alignment(flag, runs, history.left_padded)
        check_kv(flag, runs, history.k, history.declared_layout, history)
        if row.tree_parents is None:
            check_positions(flag)
            check_accounting(flag, history)
        else:  # a tree's positions and acceptance (schema 3)
            check_tree_row(flag, history)
        check_head_row(flag, history.trace.header.proposer == "head")
        check_recorded_row(flag)
        check_prefill_row(flag, history)
    if len(widths) > 1 and history.left_padded:
        findings.at(si, step, step.rows[0])(
            Invariant.ALIGNMENT,
            "mask_rle",
            "one width for all rows",
            sorted(widths),
            f"mask rows have different widths {sorted(widths)}",
        )
    for row in step.rows:  # apply writes after all rows are checked against the old state
        history.apply_write(si, row)


def check_outputs(findings: Findings, history: History) -> None:
    """Each sequence's output: within the budget, nothing after EOS, what the steps wrote."""
    trace = history.trace
    last_step = len(trace.steps) - 1
    for seq in trace.sequences:
        state, seq_id, length = history.seqs[seq.seq_id], seq.seq_id, len(seq.output_ids)
        max_new = state.budget
        if length > max_new:
            si = _or(state.step_of_token(max_new), last_step)
            message = f"sequence {seq_id} has {length} tokens > its budget of {max_new}"
            _flag_output(findings, trace, si, seq_id, max_new, length, message)
        eos_at = early_eos(seq.output_ids, history.eos)
        if eos_at is not None:
            si = _or(state.step_of_token(eos_at + 1), last_step)
            message = f"sequence {seq_id} continues after EOS"
            _flag_output(findings, trace, si, seq_id, "nothing after EOS", "tokens after EOS", message)
        # An interrupted run may have written a step's tokens without recording the step.
        if length != state.written and trace.steps and trace.header.complete:
            message = f"sequence {seq_id} output has {length} tokens but the steps wrote {state.written}"
            _flag_output(findings, trace, last_step, seq_id, state.written, length, message)


def early_eos(output_ids: list[int], eos: frozenset[int]) -> int | None:
    """Index of the first EOS before the last token (None: none; the common case, a set test in C)."""
    if eos.isdisjoint(output_ids[:-1]):
        return None
    return next(i for i, t in enumerate(output_ids[:-1]) if t in eos)


def _flag_output(
    findings: Findings, trace: Trace, si: int, seq_id: int, expected: object, actual: object, message: str
) -> None:
    """An `output_ids` violation at step index `si`, at the sequence's row there (or a stub row)."""
    if si < 0:
        return
    step = trace.steps[si]
    row = next((r for r in step.rows if r.seq_id == seq_id), None)
    findings.flag(si, step, row or stub_row(seq_id), Invariant.ACCOUNTING, "output_ids", expected, actual, message)


def _or(si: int | None, fallback: int) -> int:
    return fallback if si is None else si


# ----------------------------------------------------------------------------- verdicts


def _sequence_verdict(
    findings: Findings, history: History, seq: SequenceRecord, threshold: float, unread: bool = False
) -> SequenceVerdict:
    """`unread`: the run is unreadable from some step, so an unfinished sequence that agrees with
    its reference so far is "unread" (its output past that step was never seen), not "exact"."""
    trace = history.trace
    bad = findings.first_bad_step.get(seq.seq_id)
    bad_step = history.step_numbers[bad] if bad is not None and bad >= 0 else None  # -1: a run with no steps
    if seq.reference_ids is None:
        return SequenceVerdict(seq.seq_id, None, "no-reference", None, None, bad_step)
    index = sequence_divergence(seq, trace.header.complete)
    if index is None:
        verdict = "unread" if unread and seq.finish_reason is None else "exact"
        return SequenceVerdict(seq.seq_id, None, verdict, None, None, bad_step)
    si = history.seqs[seq.seq_id].step_of_token(index)
    margins = seq.reference_margins
    margin = margins[index] if margins is not None and index < len(margins) else None
    if bad is not None and (si is None or bad <= si):
        verdict = "desync"
    elif margin is not None and margin < threshold:
        verdict = "numerical"
    else:
        verdict = "unexplained"
    lo = max(0, index - CONTEXT_TOKENS)
    return SequenceVerdict(
        seq_id=seq.seq_id,
        first_divergence=index,
        verdict=verdict,
        divergence_step=history.step_numbers[si] if si is not None else None,
        margin=margin,
        first_violation_step=bad_step,
        context_output=seq.output_ids[lo : index + CONTEXT_TOKENS + 1],
        context_reference=seq.reference_ids[lo : index + CONTEXT_TOKENS + 1],
    )


def _run_verdict(violations: list[Violation], sequences: list[SequenceVerdict], unreadable: bool = False) -> str:
    """Any broken invariant makes the run a desync, even if the outputs happen to survive. A run the
    watch could not read to the end is unreadable, whatever its outputs: what was not read is
    neither clean nor explained."""
    if violations:
        return "desync"
    if unreadable:
        return "unreadable"
    verdicts = {s.verdict for s in sequences}
    if "unexplained" in verdicts:
        return "unexplained"
    if "numerical" in verdicts:
        return "numerical"
    return "clean"
