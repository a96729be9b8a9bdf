"""Invariant checks and divergence attribution: pure functions of a trace, no models needed.

Layout assumed: left-padded contiguous (docs/trace-format.md). For row r at a step, with n the
committed tokens before the step (prompt + emitted, the last one pending), C the cache width and
q the query length, a correct engine feeds:
  1. rectangular alignment: mask row = 0^pad 1^(C-pad+q), no hole after the first real slot,
     `left_pad` == the mask's leading zeros;
  2. position contiguity: position_ids == [n-1, n, ..., n-1+q-1];
  3. KV consistency: mask width == C + q; attended cache slots == kv_len == n - 1; every query
     slot attended; the draft's attended cache == n - 1;
  4. token accounting: len(drafts) == k, 0 <= accepted <= k, accepted == longest prefix where
     draft == target, emitted == (drafts[:accepted] + [target[accepted]]) cut at max_new_tokens
     and after EOS, written to the row's own sequence, whose pending token and length match what
     was written to it before; finished sequences never come back.
Expected values are derived here from the trace's own token history, never copied from the
engine's `*_expected` fields, so an engine cannot vouch for itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specviz.analysis.finish import FinishChecks, stub_row
from specviz.analysis.metrics import exact_match, sequence_divergence
from specviz.analysis.recorded import check_recorded_row, note_unrecorded
from specviz.analysis.report import INVARIANTS, Report, SequenceVerdict, Violation
from specviz.trace.schema import RowRecord, StepRecord, Trace

# Reference top-1 minus top-2 logit below which a flip counts as a floating-point near-tie.
# Batched GEMMs of another shape move float32 logits by ~1e-5 and bf16 ones by ~1e-1.
MARGIN_THRESHOLDS = {"float64": 1e-6, "float32": 1e-3, "float16": 0.05, "bfloat16": 0.25}
DEFAULT_MARGIN_THRESHOLD = 1e-3
MAX_REPORTED_VIOLATIONS = 10_000
CONTEXT_TOKENS = 4
SHOWN_POSITIONS = 64  # expected position lists longer than this are reported by their ends


def margin_threshold_for(trace: Trace) -> float:
    """The dtype's logit threshold; at temperature T > 0 margins are of noisy scores (logits / T +
    noise), where a logit error e moves a score by e / T, so the threshold scales by 1 / T."""
    threshold = MARGIN_THRESHOLDS.get(trace.header.target.dtype, DEFAULT_MARGIN_THRESHOLD)
    sampling = trace.header.sampling
    if sampling is not None and sampling.mode != "greedy" and sampling.temperature > 0:
        threshold /= sampling.temperature
    return threshold


@dataclass
class _SeqState:
    """What the checker reconstructs for one sequence from the rows written to it."""

    prompt_len: int
    last_token: int
    written: int = 0
    finished_at: int | None = None  # step index at which it finished
    touched_steps: list[int] = field(default_factory=list)  # step indices writing to it
    cumulative: list[int] = field(default_factory=list)  # tokens written after each of those


class _Checker:
    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        h = trace.header
        self.k = h.draft_k
        # Rectangular alignment is a rule of the left-padded layout only; other layouts get the
        # layout-free invariants (positions, attended slots, accounting).
        self.left_padded = h.layout == "left-padded"
        self.max_new = h.max_new_tokens
        self.eos = frozenset(h.eos_token_ids)
        self.violations: list[Violation] = []
        self.count = 0
        self.seqs = {
            s.seq_id: _SeqState(prompt_len=len(s.prompt_ids), last_token=s.prompt_ids[-1]) for s in trace.sequences
        }
        self.skipped: set[str] = set()
        # Violations touching each sequence (as the row's own or as the write target).
        self.first_bad_step: dict[int, int] = {}
        self.recorded: set[str] = set()  # optional state fields some row records
        self.finish = FinishChecks(self)
        sampling = h.sampling
        self.rejection = sampling is not None and sampling.mode == "rejection"
        if self.rejection:
            # The engine records what it sampled (accepted drafts, then its residual or bonus
            # sample), so accounting still holds; agreement with an oracle cannot be asked.
            self.skipped.add(
                "output equivalence: rejection sampling is distribution-exact, not token-exact "
                "(specviz.analysis.distribution tests it)"
            )

    # ------------------------------------------------------------------ reporting

    def flag(
        self,
        si: int,
        step: StepRecord,
        row: RowRecord,
        inv: int,
        fld: str,
        expected: Any,
        actual: Any,
        message: str,
    ) -> None:
        self.count += 1
        for seq_id in {row.seq_id, row.write_seq}:
            if seq_id not in self.first_bad_step:
                self.first_bad_step[seq_id] = si
        if len(self.violations) < MAX_REPORTED_VIOLATIONS:
            self.violations.append(
                Violation(step.step, si, row.row, row.seq_id, inv, INVARIANTS[inv], fld, expected, actual, message)
            )

    # ------------------------------------------------------------------ per step

    def check_step(self, si: int, step: StepRecord) -> None:
        widths = set()
        seen_seqs: set[int] = set()
        for row in step.rows:
            if row.seq_id in seen_seqs:
                self.flag(
                    si,
                    step,
                    row,
                    4,
                    "seq_id",
                    "each sequence in one row",
                    row.seq_id,
                    f"sequence {row.seq_id} appears in two rows of one step",
                )
            seen_seqs.add(row.seq_id)
            runs = [run for run in row.mask_rle if run[1] > 0]
            if row.mask_rle:  # empty: not recorded, so no width to compare
                widths.add(sum(run[1] for run in runs))
            self.check_alignment(si, step, row, runs)
            self.check_positions(si, step, row)
            self.check_kv(si, step, row, runs)
            self.check_accounting(si, step, row)
            check_recorded_row(self, si, step, row)
        if len(widths) > 1 and self.left_padded:
            first = step.rows[0]
            self.flag(
                si,
                step,
                first,
                1,
                "mask_rle",
                "one width for all rows",
                sorted(widths),
                f"mask rows have different widths {sorted(widths)}",
            )
        for row in step.rows:  # apply writes after all rows are checked against the old state
            self.apply_write(si, row)
        self.finish.check_step(si, step)

    def check_alignment(self, si: int, step: StepRecord, row: RowRecord, runs: list[list[int]]) -> None:
        if not runs:
            self.skipped.add("rectangular alignment and mask checks: rows have no mask_rle")
            return
        if not self.left_padded:
            self.skipped.add("rectangular alignment: the trace declares no left-padded layout")
            return
        lead = runs[0][1] if runs[0][0] == 0 else 0
        holes = [i for i, run in enumerate(runs) if run[0] == 0 and i > 0]
        if holes:
            hole_slots = sum(runs[i][1] for i in holes)
            self.flag(
                si,
                step,
                row,
                1,
                "mask_rle",
                "no masked slot after the first real slot",
                f"{hole_slots} masked slot(s) inside the row",
                f"{hole_slots} masked hole(s) inside the attended region",
            )
        if row.left_pad != lead:
            self.flag(
                si,
                step,
                row,
                1,
                "left_pad",
                lead,
                row.left_pad,
                f"left_pad {row.left_pad} but the mask starts with {lead} padding slots",
            )

    def check_positions(self, si: int, step: StepRecord, row: RowRecord) -> None:
        start = row.committed_before - 1
        # A range, not a list: query_len is declared by the file, only the row's list is real.
        expected = range(start, start + step.query_len)
        fed = row.position_ids
        if len(fed) != len(expected) or any(p != e for p, e in zip(fed, expected)):
            self.flag(
                si,
                step,
                row,
                2,
                "position_ids",
                _shown_range(expected),
                fed,
                f"positions start at {row.position_ids[:1]} for a row with "
                f"{row.committed_before} committed tokens (expected {start})",
            )

    def check_kv(self, si: int, step: StepRecord, row: RowRecord, runs: list[list[int]]) -> None:
        expected = row.committed_before - 1
        if row.kv_len != expected:
            self.flag(
                si,
                step,
                row,
                3,
                "kv_len",
                expected,
                row.kv_len,
                f"cache holds {row.kv_len} attended slots, expected {expected}",
            )
        if runs:
            width = sum(run[1] for run in runs)
            if width != step.cache_len + step.query_len:
                self.flag(
                    si,
                    step,
                    row,
                    3,
                    "mask_rle",
                    step.cache_len + step.query_len,
                    width,
                    f"mask width {width} != cache length {step.cache_len} + query length {step.query_len}",
                )
            else:
                attended_cache, attended_query = _split_attended(runs, step.cache_len)
                if attended_cache != row.kv_len:
                    self.flag(
                        si,
                        step,
                        row,
                        3,
                        "mask_rle",
                        row.kv_len,
                        attended_cache,
                        f"mask attends {attended_cache} cache slots but kv_len says {row.kv_len}",
                    )
                if attended_query != step.query_len:
                    self.flag(
                        si,
                        step,
                        row,
                        3,
                        "mask_rle",
                        step.query_len,
                        attended_query,
                        f"only {attended_query} of {step.query_len} query slots attended",
                    )
        if row.draft_kv_len is not None and self.k > 0 and row.draft_kv_len != expected:
            self.flag(
                si,
                step,
                row,
                3,
                "draft_kv_len",
                expected,
                row.draft_kv_len,
                f"draft cache holds {row.draft_kv_len} attended slots, expected {expected}",
            )

    def check_accounting(self, si: int, step: StepRecord, row: RowRecord) -> None:
        state = self.seqs[row.seq_id]
        k = self.k
        if state.finished_at is not None:
            self.flag(
                si,
                step,
                row,
                4,
                "seq_id",
                "finished sequences leave the batch",
                row.seq_id,
                f"sequence {row.seq_id} finished at step {self.trace.steps[state.finished_at].step} "
                f"but is decoded again",
            )
        expected_len = state.prompt_len + state.written
        if row.committed_before != expected_len:
            self.flag(
                si,
                step,
                row,
                4,
                "committed_before",
                expected_len,
                row.committed_before,
                f"row claims {row.committed_before} committed tokens; its sequence has {expected_len}",
            )
        if row.pending_token != state.last_token:
            self.flag(
                si,
                step,
                row,
                4,
                "pending_token",
                state.last_token,
                row.pending_token,
                f"fed pending token {row.pending_token}, but the sequence's last token is {state.last_token}",
            )
        if len(row.draft_tokens) != k:
            self.flag(
                si, step, row, 4, "draft_tokens", k, len(row.draft_tokens), f"{len(row.draft_tokens)} drafts for k={k}"
            )
        if not 0 <= row.accepted <= k:
            self.flag(
                si, step, row, 4, "accepted", f"0..{k}", row.accepted, f"accepted {row.accepted} drafts with k={k}"
            )
            return
        if len(row.draft_tokens) != k:
            pass  # already flagged above; the acceptance check needs k drafts
        elif len(row.target_tokens) != step.query_len or step.query_len != k + 1:
            self.skipped.add("greedy acceptance check: target_tokens missing or not k+1 long")
        else:
            matched = 0
            while matched < k and row.draft_tokens[matched] == row.target_tokens[matched]:
                matched += 1
            if row.accepted != matched:
                self.flag(
                    si,
                    step,
                    row,
                    4,
                    "accepted",
                    matched,
                    row.accepted,
                    f"accepted {row.accepted} drafts but only {matched} agree with the target",
                )
            proposal = row.draft_tokens[: row.accepted] + [row.target_tokens[row.accepted]]
            expected_out = self.cut(proposal, self.seqs[row.write_seq])
            # Emitting fewer than verification allows (no bonus, say) is slower, not wrong: it is the
            # `tokens_left_on_table` metric. Only tokens verification did not allow are a violation.
            if row.emitted != expected_out[: len(row.emitted)]:
                self.flag(
                    si,
                    step,
                    row,
                    4,
                    "emitted",
                    expected_out,
                    row.emitted,
                    "emitted tokens are not a prefix of the accepted drafts plus the bonus",
                )
        # The bonus field names the target token emitted after the accepted drafts, if one was.
        bonus = row.emitted[row.accepted] if len(row.emitted) == row.accepted + 1 else None
        if row.bonus != bonus:
            self.flag(
                si,
                step,
                row,
                4,
                "bonus",
                bonus,
                row.bonus,
                f"bonus {row.bonus} but the row emitted {len(row.emitted)} token(s) after {row.accepted} accepted",
            )
        if row.write_seq != row.seq_id:
            self.flag(
                si,
                step,
                row,
                4,
                "write_seq",
                row.seq_id,
                row.write_seq,
                f"row of sequence {row.seq_id} wrote its tokens to sequence {row.write_seq}",
            )

    def cut(self, proposal: list[int], state: _SeqState) -> list[int]:
        out = proposal[: max(0, self.max_new - state.written)]
        for i, token in enumerate(out):
            if token in self.eos:
                return out[: i + 1]
        return out

    def apply_write(self, si: int, row: RowRecord) -> None:
        state = self.seqs[row.write_seq]
        if row.emitted:
            state.written += len(row.emitted)
            state.last_token = row.emitted[-1]
            state.touched_steps.append(si)
            state.cumulative.append(state.written)
        done = row.emitted and (row.emitted[-1] in self.eos) or state.written >= self.max_new
        if done and state.finished_at is None:
            state.finished_at = si

    # ------------------------------------------------------------------ per sequence

    def check_outputs(self) -> None:
        last_step = len(self.trace.steps) - 1
        for seq in self.trace.sequences:
            state = self.seqs[seq.seq_id]
            if len(seq.output_ids) > self.max_new:
                self._flag_sequence(
                    _step_writing(state, self.max_new, last_step),
                    seq.seq_id,
                    "output_ids",
                    self.max_new,
                    len(seq.output_ids),
                    f"sequence {seq.seq_id} has {len(seq.output_ids)} tokens > max_new_tokens",
                )
            eos_at = next((i for i, t in enumerate(seq.output_ids[:-1]) if t in self.eos), None)
            if eos_at is not None:
                self._flag_sequence(
                    _step_writing(state, eos_at + 1, last_step),
                    seq.seq_id,
                    "output_ids",
                    "nothing after EOS",
                    "tokens after EOS",
                    f"sequence {seq.seq_id} continues after EOS",
                )
            # An interrupted run may have written a step's tokens without recording the step.
            if len(seq.output_ids) != state.written and self.trace.steps and self.trace.header.complete:
                self._flag_sequence(
                    last_step,
                    seq.seq_id,
                    "output_ids",
                    state.written,
                    len(seq.output_ids),
                    f"sequence {seq.seq_id} output has {len(seq.output_ids)} tokens but the steps "
                    f"wrote {state.written}",
                )

    def _flag_sequence(self, si: int, seq_id: int, fld: str, expected: Any, actual: Any, message: str) -> None:
        if si < 0:
            return
        step = self.trace.steps[si]
        row = next((r for r in step.rows if r.seq_id == seq_id), None)
        stub = row or stub_row(seq_id)
        self.flag(si, step, stub, 4, fld, expected, actual, message)


def _shown_range(expected: range) -> list[int] | str:
    """A violation's expected positions: the list when short, else its ends (reports stay small)."""
    if len(expected) <= SHOWN_POSITIONS:
        return list(expected)
    return f"{expected.start}..{expected.stop - 1} ({len(expected)} positions)"


def _split_attended(runs: list[list[int]], cache_len: int) -> tuple[int, int]:
    """Attended slots before and after the cache/query boundary."""
    cache = query = 0
    pos = 0
    for value, count in runs:
        end = pos + count
        if value:
            in_cache = max(0, min(end, cache_len) - pos)
            cache += in_cache
            query += count - in_cache
        pos = end
    return cache, query


def _step_writing(state: _SeqState, index: int, fallback: int) -> int:
    """The step index that wrote output token `index` (the first one past a limit), else `fallback`."""
    si = _divergence_step(state, index)
    return fallback if si is None else si


def _divergence_step(state: _SeqState, index: int) -> int | None:
    """Index of the step that wrote output token `index` of a sequence."""
    for si, written in zip(state.touched_steps, state.cumulative):
        if written > index:
            return si
    return state.touched_steps[-1] if state.touched_steps else None


def check_trace(trace: Trace, margin_threshold: float | None = None) -> Report:
    threshold = margin_threshold if margin_threshold is not None else margin_threshold_for(trace)
    checker = _Checker(trace)
    for si, step in enumerate(trace.steps):
        checker.check_step(si, step)
    checker.check_outputs()
    checker.finish.check_run()
    note_unrecorded(checker)
    violations = sorted(checker.violations, key=lambda v: (v.step_index, v.row, v.invariant))
    sequences = [_sequence_verdict(trace, checker, seq, threshold) for seq in trace.sequences]
    return Report(
        verdict=_run_verdict(violations, sequences),
        violations=violations,
        sequences=sequences,
        exact_match=exact_match(trace),
        margin_threshold=threshold,
        skipped_checks=sorted(checker.skipped),
        violation_count=checker.count,
    )


def _sequence_verdict(trace: Trace, checker: _Checker, seq: Any, threshold: float) -> SequenceVerdict:
    bad = checker.first_bad_step.get(seq.seq_id)
    bad_step = trace.steps[bad].step if bad is not None and bad >= 0 else None  # -1: a run with no steps
    if seq.reference_ids is None:
        return SequenceVerdict(seq.seq_id, None, "no-reference", None, None, bad_step)
    index = sequence_divergence(seq, trace.header.complete)
    if index is None:
        return SequenceVerdict(seq.seq_id, None, "exact", None, None, bad_step)
    state = checker.seqs[seq.seq_id]
    si = _divergence_step(state, index)
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
        divergence_step=trace.steps[si].step if si is not None else None,
        margin=margin,
        first_violation_step=bad_step,
        context_output=seq.output_ids[lo : index + CONTEXT_TOKENS + 1],
        context_reference=seq.reference_ids[lo : index + CONTEXT_TOKENS + 1],
    )


def _run_verdict(violations: list[Violation], sequences: list[SequenceVerdict]) -> str:
    """Any broken invariant makes the run a desync, even if the outputs happen to survive."""
    if violations:
        return "desync"
    verdicts = {s.verdict for s in sequences}
    if "unexplained" in verdicts:
        return "unexplained"
    if "numerical" in verdicts:
        return "numerical"
    return "clean"
