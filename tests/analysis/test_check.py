"""The checker against traces whose faults we know: synthetic mutations and tiny-model runs."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import pytest
from tiny import make_pair

from specviz.analysis.check import MARGIN_THRESHOLDS, check_trace
from specviz.engine.faults import FAULTS
from specviz.engine.run import RunConfig, greedy_references, run, tokenize_prompts
from specviz.trace.io import save_trace
from specviz.trace.schema import SamplingInfo
from specviz.trace.synthetic import synthetic_trace
from specviz.trace.token_text import attach_token_text

PROMPTS = [
    "hello world",
    "a",
    "the quick brown fox jumps over the lazy dog",
    "xy",
    "some medium prompt",
    "zz top",
    "1234567890" * 3,
    "q",
    "ragged rows",
    "mixed",
]


@functools.cache
def clean_synth():
    return synthetic_trace(24, 8, 4, 24)


def mutated(edit) -> object:
    trace = copy.deepcopy(clean_synth())
    edit(trace)
    return trace


def first(report):
    v = report.first_violation
    return (v.step_index, v.row, v.invariant, v.field)


def test_synthetic_clean_trace_is_clean() -> None:
    report = check_trace(clean_synth())
    assert report.verdict == "clean"
    assert report.violations == [] and report.exact_match == 1.0


@pytest.mark.parametrize(
    "edit,expected",
    [
        (lambda t: t.steps[5].rows[2].position_ids.__setitem__(0, 999), (5, 2, 2, "position_ids")),
        (lambda t: setattr(t.steps[4].rows[1], "kv_len", t.steps[4].rows[1].kv_len + 1), (4, 1, 3, "kv_len")),
        (lambda t: setattr(t.steps[3].rows[0], "draft_kv_len", 0), (3, 0, 3, "draft_kv_len")),
        (lambda t: setattr(t.steps[6].rows[3], "write_seq", t.steps[6].rows[4].seq_id), (6, 3, 4, "write_seq")),
        (lambda t: setattr(t.steps[2].rows[1], "left_pad", t.steps[2].rows[1].left_pad + 1), (2, 1, 1, "left_pad")),
    ],
)
def test_single_field_mutation_is_found_where_it_was_made(edit, expected) -> None:
    report = check_trace(mutated(edit))
    assert report.verdict == "desync"
    assert first(report) == expected


def test_mask_hole_is_an_alignment_violation() -> None:
    def punch(t):
        row = next(r for r in t.steps[7].rows if r.committed_before > 5)
        runs = row.mask_rle
        last = runs[-1]
        runs[-1] = [1, last[1] - 3]
        runs.extend([[0, 1], [1, 2]])  # same width, one hole before the last two slots

    report = check_trace(mutated(punch))
    kinds = {(v.invariant, v.field) for v in report.violations if v.step_index == 7}
    assert (1, "mask_rle") in kinds


def test_extra_accepted_draft_is_token_accounting() -> None:
    def extra(t):
        for si, step in enumerate(t.steps):
            for row in step.rows:
                if row.accepted < len(row.draft_tokens) and not row.finished:
                    row.accepted += 1
                    return si

    trace = copy.deepcopy(clean_synth())
    si = extra(trace)
    report = check_trace(trace)
    assert report.first_violation.step_index == si
    assert report.first_violation.field == "accepted"


def test_sequence_decoded_after_finishing_is_flagged() -> None:
    trace = copy.deepcopy(clean_synth())
    si, row = next((i, r) for i, s in enumerate(trace.steps) for r in s.rows if r.finished)
    later = copy.deepcopy(trace.steps[si + 1])
    ghost = copy.deepcopy(row)
    ghost.row = len(later.rows)
    later.rows.append(ghost)
    trace.steps[si + 1] = later
    messages = [v.message for v in check_trace(trace).violations]
    assert any("decoded again" in m for m in messages)


def test_attribution_numerical_vs_unexplained_vs_desync() -> None:
    trace = copy.deepcopy(clean_synth())
    seq = trace.sequences[3]
    seq.reference_ids = list(seq.reference_ids)
    seq.reference_ids[5] = (seq.reference_ids[5] % 900) + 1
    seq.reference_margins[5] = 1e-5  # a near-tie at the divergent token: numerical
    report = check_trace(trace)
    assert report.verdict == "numerical"
    verdict = report.sequences[3]
    assert (verdict.verdict, verdict.first_divergence) == ("numerical", 5)
    seq.reference_margins[5] = 3.0  # a confident reference: nothing explains it
    assert check_trace(trace).verdict == "unexplained"
    # A broken invariant for that sequence at or before the divergent token's step: desync.
    row = next(r for s in trace.steps for r in s.rows if r.seq_id == 3)
    row.kv_len += 1
    report = check_trace(trace)
    assert report.verdict == "desync" and report.sequences[3].verdict == "desync"


def test_attribution_boundary_context_and_missing_reference() -> None:
    """A margin exactly at the threshold is not a near-tie; the context is the 4 tokens either
    side of the divergence; a sequence without a reference is `no-reference` (mutation survivors)."""
    trace = copy.deepcopy(clean_synth())
    seq = trace.sequences[3]
    seq.reference_ids = list(seq.reference_ids)
    seq.reference_ids[6] = (seq.reference_ids[6] % 900) + 1
    seq.reference_margins[6] = 0.5
    verdict = check_trace(trace, margin_threshold=0.5).sequences[3]
    assert verdict.verdict == "unexplained" and verdict.margin == 0.5
    assert verdict.context_output == seq.output_ids[2:11] and verdict.context_reference == seq.reference_ids[2:11]
    assert check_trace(trace, margin_threshold=0.5000001).sequences[3].verdict == "numerical"
    trace.sequences[4].reference_ids = None
    report = check_trace(trace, margin_threshold=0.5)
    assert (report.sequences[4].verdict, report.sequences[4].first_divergence) == ("no-reference", None)


def test_checker_handles_trace_without_masks() -> None:
    trace = copy.deepcopy(clean_synth())
    for step in trace.steps:
        for row in step.rows:
            row.mask_rle = []
    report = check_trace(trace)
    assert report.verdict == "clean"
    assert any("mask_rle" in s for s in report.skipped_checks)


TINY_NEW = 16  # new tokens per sequence in the tiny-model runs below


@functools.cache
def tiny_pair():
    return make_pair("llama")


@functools.cache
def tiny_references() -> tuple[tuple[tuple[int, ...], tuple[float, ...]], ...]:
    """The batch-1 greedy oracle (tokens, margins) of PROMPTS, decoded once by the function `run`
    decodes it with: each of the 15 runs below would decode the same 10 x 16 tokens again."""
    ids = tokenize_prompts(tiny_pair(), PROMPTS, TINY_NEW)
    return tuple((tuple(t), tuple(m)) for t, m in greedy_references(tiny_pair(), ids, TINY_NEW))


@functools.cache
def tiny_run(method: str, batch: int, k: int, fault: str | None = None):
    """One run per setting (the CLI test reads two of them again), with the shared oracle attached
    as `reference=True` would write it. Callers do not edit the trace."""
    cfg = RunConfig(
        method=method, fault=fault, batch_size=batch, draft_k=k, max_new_tokens=TINY_NEW, kv_check_every=1,
        reference=False,
    )  # fmt: skip
    trace = run(tiny_pair(), PROMPTS, cfg)
    for seq in trace.sequences:  # sequence i is prompt i (a greedy oracle does not depend on the run)
        seq.reference_ids, seq.reference_margins = map(list, tiny_references()[seq.seq_id])
    return attach_token_text(trace, tiny_pair().tokenizer)  # the references' tokens too, as `run` attaches them


@pytest.mark.parametrize(
    "method,batch,k", [("baseline", 4, 0), ("eqspec", 1, 2), ("eqspec", 8, 4), ("exspec", 3, 3), ("exspec", 8, 8)]
)
def test_correct_runs_have_no_false_alarms(method: str, batch: int, k: int) -> None:
    report = check_trace(tiny_run(method, batch, k))
    assert report.verdict == "clean", report.first_violation
    assert report.violation_count == 0


# Faults of head or tree drafting need a head or --tree: tests/engine/test_drafting_faults.py; the
# penalty's, a repetition penalty: tests/engine/test_repetition_penalty.py.
CHAIN_FAULTS = [
    f for f in sorted(FAULTS) if not (FAULTS[f].needs_proposer or FAULTS[f].needs_tree or FAULTS[f].needs_penalty)
]


@pytest.mark.parametrize("fault", CHAIN_FAULTS)
def test_each_fault_is_caught_at_the_step_and_row_it_fired(fault: str) -> None:
    trace = tiny_run(FAULTS[fault].default_method, 8, 4, fault)
    events = trace.header.fault_events
    assert events, f"{fault} never fired"
    report = check_trace(trace)
    assert report.verdict == "desync"
    v = report.first_violation
    assert (v.step, v.row) == (events[0]["step"], events[0]["row"])


def test_check_cli_json_and_exit_codes(tmp_path, capsys) -> None:
    from specviz.cli import main

    good = save_trace(tiny_run("eqspec", 8, 4), tmp_path / "good.json.gz")
    bad = save_trace(tiny_run("eqspec", 8, 4, "stale-kv"), tmp_path / "bad.json")
    assert main(["check", str(good), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["verdict"] == "clean" and payload["first_violation"] is None
    assert main(["check", str(bad), "--json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    assert payload["verdict"] == "desync" and payload["violations"]
    assert {"verdict", "violations", "first_violation", "sequences", "exact_match"} <= payload.keys()
    assert main(["check", str(bad)]) == 1
    text = capsys.readouterr().out
    assert "DESYNC" in text and "first at step" in text
    (tmp_path / "junk.json").write_text("{not json")
    assert main(["check", str(tmp_path / "junk.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not valid JSON" in err
    assert main(["check", str(tmp_path / "missing.json")]) == 2


CALIBRATION = Path(__file__).resolve().parents[2] / "docs" / "margin-calibration.json"


def test_margin_thresholds_follow_the_calibration() -> None:
    """Each threshold is twice the largest measured margin noise, rounded up to a power of two:
    above the noise (and every flip measured) but not far above it (docs/forensics.md)."""
    rows = json.loads(CALIBRATION.read_text())
    assert {r["dtype"] for r in rows} == {"float64", "float32", "bfloat16", "float16"}
    for dtype in ("float32", "bfloat16", "float16"):
        mine = [r for r in rows if r["dtype"] == dtype]
        assert {r["model"] for r in mine} == {"default-target", "tiny-llama"} and all(r["agreeing"] > 400 for r in mine)
        noise = max(r["max_margin_err"] for r in mine)
        threshold = MARGIN_THRESHOLDS[dtype]
        assert 2 * noise <= threshold < 4 * noise, dtype
        assert all(r["max_flip_margin"] is None or r["max_flip_margin"] < threshold for r in mine)
        # some positions of both models are confident beyond it, so "numerical" is not automatic
        assert all(r["max_reference_margin"] > threshold for r in mine), dtype
    assert MARGIN_THRESHOLDS["float64"] <= MARGIN_THRESHOLDS["float32"] < MARGIN_THRESHOLDS["float16"]
    assert MARGIN_THRESHOLDS["float16"] < MARGIN_THRESHOLDS["bfloat16"]


@functools.cache
def low_precision_run(dtype: str, fault: str | None = None):
    import torch

    pair = make_pair("llama")
    pair.dtype = getattr(torch, dtype)
    pair.target, pair.draft = pair.target.to(pair.dtype), pair.draft.to(pair.dtype)
    prompts, new = (PROMPTS * 2, 32) if fault is None else (PROMPTS, 16)
    cfg = RunConfig(method="eqspec", batch_size=8, draft_k=4, max_new_tokens=new, fault=fault)
    return run(pair, prompts, cfg)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_flips_are_numerical_and_only_at_near_ties(dtype: str) -> None:
    """Negative control: batched GEMMs in bf16/fp16 flip near-ties; no invariant breaks, so
    `numerical`, and only where the reference margin is within the calibrated noise."""
    trace = low_precision_run(dtype)
    report = check_trace(trace)
    assert report.margin_threshold == MARGIN_THRESHOLDS[dtype] and report.violation_count == 0
    margins = [m for seq in trace.sequences for m in seq.reference_margins]
    assert max(margins) > report.margin_threshold  # the threshold does not cover the whole run
    flipped = [s for s in report.sequences if s.first_divergence is not None]
    if dtype == "bfloat16":
        assert flipped, "bf16 should flip at least one near-tie against the batch-1 reference"
    for s in flipped:
        assert s.verdict == "numerical" and s.margin < report.margin_threshold / 4, (s.seq_id, s.margin)
    assert report.verdict == ("numerical" if flipped else "clean")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_confident_divergence_is_unexplained(dtype: str) -> None:
    """A divergence at a token the reference was sure of (margin above the dtype's threshold) is
    not noise, even in bf16: make an exact sequence's reference disagree there."""
    trace = copy.deepcopy(low_precision_run(dtype))
    threshold = MARGIN_THRESHOLDS[dtype]
    before = {s.seq_id: s.verdict for s in check_trace(trace).sequences}
    seq, index = next(
        (seq, i)
        for seq in trace.sequences
        if before[seq.seq_id] == "exact"
        for i, m in enumerate(seq.reference_margins)
        if threshold < m < 2 * threshold  # confident, but only just: the bound is what is tested
    )
    seq.reference_ids[index] = (seq.reference_ids[index] + 1) % 96
    verdict = next(s for s in check_trace(trace).sequences if s.seq_id == seq.seq_id)
    assert (verdict.verdict, verdict.first_divergence) == ("unexplained", index)
    assert check_trace(trace).verdict == "unexplained"
    # the same edit at a near-tie of that sequence is numerical
    seq.reference_ids[index] -= 1
    seq.reference_margins[index] = threshold / 2
    seq.reference_ids[index] = (seq.reference_ids[index] + 1) % 96
    assert next(s for s in check_trace(trace).sequences if s.seq_id == seq.seq_id).verdict == "numerical"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_real_desync_stays_desync(dtype: str) -> None:
    """A stale KV cache in a bf16/fp16 run: a sequence diverging at or after its first broken
    invariant is a desync, even where its margin is below the threshold (most are: the tiny
    model's margins are small); one that flipped before any corruption is numerical."""
    report = check_trace(low_precision_run(dtype, "stale-kv"))
    threshold = MARGIN_THRESHOLDS[dtype]
    assert report.verdict == "desync" and report.violation_count > 0
    diverged = [s for s in report.sequences if s.first_divergence is not None]
    after = [s for s in diverged if s.first_violation_step is not None and s.first_violation_step <= s.divergence_step]
    assert len(after) >= len(diverged) - 1 and len(after) >= 5
    assert all(s.verdict == "desync" for s in after)
    assert any(s.margin < threshold for s in after)  # the margin alone would have said numerical
    for s in diverged:
        if s not in after:  # flipped before the fault struck it: noise, a near-tie
            assert s.verdict == "numerical" and s.margin < threshold


# ----------------------------------------------------------------------------- completeness and endings

EOS_NEW = 99_999  # a token id the synthetic trace never uses otherwise


def drop_after(trace, seq_id: int, si: int) -> None:
    """Remove sequence `seq_id` from every step after index `si` (rows renumbered, empty steps dropped)."""
    for step in trace.steps[si + 1 :]:
        step.rows = [r for r in step.rows if r.seq_id != seq_id]
        for i, r in enumerate(step.rows):
            r.row = i
    trace.steps = trace.steps[: si + 1] + [s for s in trace.steps[si + 1 :] if s.rows]
    seq = next(s for s in trace.sequences if s.seq_id == seq_id)
    seq.output_ids = [t for s in trace.steps[: si + 1] for r in s.rows if r.write_seq == seq_id for t in r.emitted]


def end_with_eos(trace, seq_id: int):
    """Make `seq_id` end, correctly, with an EOS bonus at its first step that emits a bonus."""
    si, row = next(
        (i, r)
        for i, s in enumerate(trace.steps)
        for r in s.rows
        if r.seq_id == seq_id and r.bonus is not None and not r.finished
    )
    row.target_tokens[row.accepted] = row.bonus = row.emitted[-1] = EOS_NEW
    row.finished, row.finish_reason, row.left_pad_after = True, "eos", None
    drop_after(trace, seq_id, si)
    seq = trace.sequences[seq_id]
    seq.reference_ids, seq.reference_margins = list(seq.output_ids), [1.0] * len(seq.output_ids)
    seq.finish_reason = "eos"
    trace.header.eos_token_ids = [0, EOS_NEW]
    return si, row


@functools.cache
def eos_synth():
    trace = copy.deepcopy(clean_synth())
    return trace, end_with_eos(trace, 2)


def eos_mutated(edit):
    """`edit(trace, step_index, row)` on a copy of the EOS-ending trace; returns (trace, si, row)."""
    trace, (si, row) = copy.deepcopy(eos_synth())
    edit(trace, si, row)
    return trace, si, row


def test_sequence_ending_with_eos_is_clean() -> None:
    trace, (si, row) = eos_synth()
    assert row.emitted[-1] == EOS_NEW and check_trace(trace).verdict == "clean"


@pytest.mark.parametrize(
    "edit,fld",
    [
        (lambda t, si, r: setattr(t.sequences[2], "finish_reason", "length"), "finish_reason"),
        (lambda t, si, r: setattr(r, "finish_reason", "length"), "finish_reason"),
        (lambda t, si, r: (setattr(r, "finish_reason", None), setattr(r, "finished", False)), "finish_reason"),
        (lambda t, si, r: setattr(r, "finished", False), "finished"),
        (lambda t, si, r: setattr(t.header, "eos_token_ids", [0]), "finish_reason"),  # that token is no EOS
    ],
    ids=["sequence says length", "row says length", "row says nothing", "finished flag", "eos without EOS"],
)
def test_wrong_finish_reason_is_found_where_the_sequence_ended(edit, fld) -> None:
    trace, si, row = eos_mutated(edit)
    report = check_trace(trace)
    assert report.verdict == "desync"
    assert first(report) == (si, row.row, 4, fld), report.first_violation


def test_tokens_after_eos_in_one_step_are_found_at_that_step() -> None:
    trace, si, row = eos_mutated(lambda t, si, r: (r.emitted.append(7), t.sequences[2].output_ids.append(7)))
    report = check_trace(trace)
    hits = {(v.step_index, v.row, v.field) for v in report.violations}
    assert report.first_violation.step_index == si and (si, row.row, "emitted") in hits
    assert any("after EOS" in v.message for v in report.violations if v.step_index == si)


def test_length_claimed_one_token_short_is_found_at_that_step() -> None:
    trace = copy.deepcopy(clean_synth())
    # The row just before a sequence's finishing "length" row: it claims the budget is spent.
    ends = [(si, r) for si, s in enumerate(trace.steps) for r in s.rows if r.finish_reason == "length"]
    si_end, end = ends[0]
    si, row = next((i, r) for i in range(si_end - 1, -1, -1) for r in trace.steps[i].rows if r.seq_id == end.seq_id)
    row.finished, row.finish_reason = True, "length"
    report = check_trace(trace)
    assert first(report) == (si, row.row, 4, "finish_reason")
    assert "length" in report.first_violation.message and f"of {trace.header.max_new_tokens}" in (
        report.first_violation.message
    )


def _dropped(complete: bool):
    trace = copy.deepcopy(clean_synth())
    seq_id = 5
    si = [i for i, s in enumerate(trace.steps) if any(r.seq_id == seq_id for r in s.rows)][2]
    drop_after(trace, seq_id, si)
    trace.sequences[seq_id].finish_reason = None
    trace.header.complete = complete
    return trace, si, seq_id


def test_sequence_dropped_from_a_complete_run_is_a_located_violation() -> None:
    trace, si, seq_id = _dropped(complete=True)
    report = check_trace(trace)
    assert report.verdict == "desync" and report.exact_match < 1.0
    located = [v for v in report.violations if v.seq_id == seq_id]
    assert located and (located[0].step_index, located[0].field) == (si, "finish_reason")
    assert "unfinished" in located[0].message
    assert report.sequences[seq_id].verdict == "desync"


def test_interrupted_run_keeps_identical_so_far() -> None:
    trace, _, seq_id = _dropped(complete=False)
    report = check_trace(trace)
    assert report.verdict == "clean" and report.exact_match == 1.0


def test_sequence_never_scheduled_in_a_complete_run_is_a_violation_at_the_run() -> None:
    trace = copy.deepcopy(clean_synth())
    drop_after(trace, 7, -1)
    trace.sequences[7].finish_reason = None
    report = check_trace(trace)
    assert report.verdict == "desync" and report.exact_match < 1.0
    v = next(v for v in report.violations if v.seq_id == 7)
    assert (v.step_index, v.row) == (len(trace.steps) - 1, -1) and "never decoded" in v.message
    assert report.sequences[7].verdict == "desync"


def test_complete_run_without_steps_is_not_clean() -> None:
    from specviz.analysis.text import render_report

    trace = copy.deepcopy(clean_synth())
    trace.steps = []
    for seq in trace.sequences:
        seq.output_ids, seq.finish_reason = [], None
    report = check_trace(trace)
    assert report.verdict == "desync" and report.exact_match == 0.0
    assert report.violation_count == len(trace.sequences)
    assert (report.first_violation.step, report.first_violation.row) == (-1, -1)
    assert "never decoded" in render_report(trace, report)


def test_rows_without_mask_next_to_rows_with_one_raise_no_alarm() -> None:
    trace = copy.deepcopy(clean_synth())
    for step in trace.steps:
        for row in step.rows[::2]:
            row.mask_rle = []
    report = check_trace(trace)
    assert report.verdict == "clean", report.first_violation
    assert any("mask_rle" in s for s in report.skipped_checks)


def test_bonus_must_name_the_emitted_bonus() -> None:
    trace = copy.deepcopy(clean_synth())
    si, row = next((i, r) for i, s in enumerate(trace.steps) for r in s.rows if r.bonus is not None)
    row.bonus = None
    assert first(check_trace(trace)) == (si, row.row, 4, "bonus")


# ----------------------------------------------------------------------------- optional state fields (v2)


@pytest.mark.parametrize(
    "fld,value,invariant",
    [
        ("query_causal", False, 3),
        ("draft_position_ids", "off-by-one", 2),
        ("draft_kv_lens", "one-short", 3),
        ("kv_mismatch_slot", "slot", 3),
        ("draft_input_tokens", "another-row", 7),
    ],
)
def test_recorded_state_fields_are_checked(fld: str, value, invariant: int) -> None:
    trace = copy.deepcopy(clean_synth())
    for step in trace.steps:  # a correct recording first: no alarm
        for row in step.rows:
            n = row.committed_before
            row.query_causal = True
            row.draft_position_ids = list(range(n - 1, n - 1 + 4))
            row.draft_kv_lens = list(range(n - 1, n - 1 + 4))
            row.kv_content_checked = True
            row.draft_input_tokens = [row.pending_token, *row.draft_tokens[:3]]
    report = check_trace(trace)
    assert report.verdict == "clean" and not any("draft" in s or "KV content" in s for s in report.skipped_checks)
    row = trace.steps[3].rows[2]
    n = row.committed_before
    bad = {
        "off-by-one": list(range(n, n + 4)),
        "one-short": [n - 2] + list(range(n, n + 3)),
        "slot": row.left_pad + 1,
        # call 2 fed a token the row never drafted (another row's, as stale-draft-map does)
        "another-row": row.draft_input_tokens[:2] + [row.draft_tokens[1] + 1] + row.draft_input_tokens[3:],
    }.get(value, value)
    setattr(row, fld, bad)
    assert first(check_trace(trace)) == (3, 2, invariant, fld)


def test_unrecorded_state_fields_are_reported_as_skipped() -> None:
    skipped = " ".join(map(str, check_trace(clean_synth()).skipped_checks))
    assert "draft_position_ids" in skipped and "draft_kv_lens" in skipped and "kv_content_checked" in skipped
    assert "draft_input_tokens" in skipped  # schema 4: every older trace lacks it


@pytest.mark.parametrize(("proposer", "draft_k"), [("head", 4), ("ngram", 4), ("draft-model", 0)])
def test_draft_model_checks_go_unmentioned_without_a_draft_model(proposer: str, draft_k: int) -> None:
    """A head, n-gram lookup or the baseline makes no draft-model calls: a check of their positions
    and attended widths does not apply, so no note says it was skipped (the others still do)."""
    trace = copy.deepcopy(clean_synth())
    trace.header.proposer, trace.header.draft_k = proposer, draft_k
    skipped = " ".join(map(str, check_trace(trace).skipped_checks))
    assert "draft_position_ids" not in skipped and "draft_kv_lens" not in skipped, skipped
    assert "draft_input_tokens" not in skipped and "kv_content_checked" in skipped


def test_check_json_into_a_closed_pipe_exits_quietly(tmp_path) -> None:
    """`specviz check --json | head`: no BrokenPipeError traceback, and the verdict's exit code."""
    import subprocess
    import sys

    trace = copy.deepcopy(clean_synth())
    for step in trace.steps:  # thousands of violations: far more JSON than a pipe buffer holds
        for row in step.rows:
            row.kv_len += 1
    path = save_trace(trace, tmp_path / "bad.json")
    cmd = f"{sys.executable} -m specviz check --json {path} | head -c 100 >/dev/null; exit ${{PIPESTATUS[0]}}"
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert done.stderr == "" and done.returncode == 1, done.stderr[-500:]


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "opt", "qwen3", "olmo2", "gemma2", "mixtral"])
def test_kv_content_check_works_across_families(family: str) -> None:
    """Learned absolute (GPT-2, OPT) and partial rotary (NeoX) positions, key norms (Qwen3, OLMo2),
    scaled embeddings and mixed sliding layers (Gemma2), expert MLPs (Mixtral): the expected keys,
    computed from packed rows and captured at layer 0's cache write, match a clean cache and
    find a copied one."""
    pair = make_pair(family)
    common = {"method": "eqspec", "batch_size": 4, "draft_k": 3, "max_new_tokens": 8, "kv_check_every": 1}
    clean = run(pair, PROMPTS[:4], RunConfig(**common))
    assert check_trace(clean).verdict == "clean"
    assert all(r.kv_content_checked for s in clean.steps for r in s.rows)
    broken = run(pair, PROMPTS[:4], RunConfig(fault="kv-row-copy", **common))
    v = check_trace(broken).first_violation
    event = broken.header.fault_events[0]
    assert (v.step, v.row, v.field) == (event["step"], event["row"], "kv_mismatch_slot")


def test_a_model_the_kv_check_cannot_read_runs_unchecked_and_says_why(monkeypatch) -> None:
    """A checker failure (a model whose layer 0 is not attention, a cache without plain keys)
    switches the check off for the run instead of ending it; the trace says why."""
    from specviz.engine.kv.content import KVContentChecker

    def refuse(self, cache, mask, contexts):
        raise TypeError("the KV-content check needs an attention layer first (layer 0 wrote no keys)")

    monkeypatch.setattr(KVContentChecker, "first_mismatches", refuse)
    pair = make_pair("llama")
    trace = run(
        pair, PROMPTS[:3], RunConfig(method="eqspec", batch_size=3, draft_k=2, max_new_tokens=6, kv_check_every=1)
    )
    assert trace.header.complete and "attention layer first" in trace.header.options["kv_check_unavailable"]
    assert not any(r.kv_content_checked for s in trace.steps for r in s.rows)
    assert check_trace(trace).verdict == "clean"


# ----------------------------------------------------------------------------- hand-sized traces (issue 26)
#
# `small()`: synthetic_trace(2, 2, 2, 5), two prompts, batch 2, k = 2, a budget of 5, two steps:
#     step 0: row 0 seq 0 emits [286, 994, 712]   row 1 seq 1 emits [343, 138, 120]
#     step 1: row 0 seq 0 emits [10, 427] length  row 1 seq 1 emits [73, 308] length
# masks: step 0 row 0 [[0, 5], [1, 5]], row 1 [[1, 10]] (width 10 = cache 7 + query 3).


def small():
    trace = synthetic_trace(2, 2, 2, 5)
    assert [r.emitted for s in trace.steps for r in s.rows] == [[286, 994, 712], [343, 138, 120], [10, 427], [73, 308]]
    assert [r.mask_rle for r in trace.steps[0].rows] == [[[0, 5], [1, 5]], [[1, 10]]]
    return trace


def where(v) -> tuple:
    return (v.step_index, v.row, v.seq_id, v.field)


def diverge(trace, seq_id: int, index: int, margin: float) -> None:
    """The reference of `seq_id` differs at token `index`, with that reference margin there."""
    seq = trace.sequences[seq_id]
    seq.reference_ids[index] += 1
    seq.reference_margins[index] = margin


def test_float64_threshold_is_a_floor_of_1e_6() -> None:
    trace = small()
    trace.header.target.dtype = "float64"
    diverge(trace, 0, 3, 5e-7)
    report = check_trace(trace)
    assert report.margin_threshold == 1e-6
    assert (report.verdict, report.sequences[0].verdict, report.sequences[0].first_divergence) == (
        "numerical",
        "numerical",
        3,
    )
    # the context: up to 4 tokens either side of the divergence, from the first token here
    assert report.sequences[0].context_output == [286, 994, 712, 10, 427]
    assert report.sequences[0].context_reference == [286, 994, 712, 11, 427]
    trace.sequences[0].reference_margins[3] = 2e-6
    assert check_trace(trace).sequences[0].verdict == "unexplained"


def test_first_violation_step_names_the_step_not_its_index() -> None:
    """Steps numbered 10 and 11: a KV fault of seq 1 at the first step (index 0) is step 10."""
    trace = small()
    for i, step in enumerate(trace.steps):
        step.step = 10 + i
    trace.steps[0].rows[1].kv_len += 1
    report = check_trace(trace)
    assert [(s.first_violation_step, s.verdict) for s in report.sequences] == [(None, "exact"), (10, "exact")]


@pytest.mark.parametrize(
    "mode,temperature,threshold",
    [
        ("coupled", 2.0, 2.0**-17),  # float32's 2**-16 / T: a logit error e moves a score by e / T
        ("coupled", 0.5, 2.0**-15),
        ("rejection", 4.0, 2.0**-18),
        ("greedy", 2.0, 2.0**-16),  # greedy ignores the temperature
        ("coupled", 0.0, 2.0**-16),  # no temperature recorded: nothing to divide by
    ],
)
def test_threshold_scales_with_the_sampling_temperature(mode: str, temperature: float, threshold: float) -> None:
    trace = small()
    trace.header.sampling = SamplingInfo(mode=mode, temperature=temperature)
    assert check_trace(trace).margin_threshold == threshold


@pytest.mark.parametrize("mode,skipped", [("rejection", True), ("coupled", False), ("greedy", False)])
def test_rejection_runs_say_output_equivalence_is_not_checked(mode: str, skipped: bool) -> None:
    trace = small()
    trace.header.sampling = SamplingInfo(mode=mode, temperature=1.0)
    report = check_trace(trace)
    assert report.verdict == "clean"
    notes = [(s.check, s.steps, s.of) for s in report.skipped_checks if s.check == "output equivalence"]
    assert notes == ([("output equivalence", 2, 2)] if skipped else [])


def outputs(report) -> list[tuple]:
    return [(where(v), v.expected, v.actual, v.message) for v in report.violations if v.field == "output_ids"]


def test_output_must_be_what_the_steps_wrote_in_a_complete_run() -> None:
    """Seq 1's output loses its last token: the steps wrote 5; found at the last step, its row."""
    trace = small()
    trace.sequences[1].output_ids.pop()
    assert outputs(check_trace(trace)) == [
        ((1, 1, 1, "output_ids"), 5, 4, "sequence 1 output has 4 tokens but the steps wrote 5")
    ]
    trace.header.complete = False  # an interrupted run may have written a step it did not record
    assert outputs(check_trace(trace)) == []


def test_output_over_the_budget_is_found_at_the_step_that_wrote_past_it() -> None:
    """Step 1 row 1 emits a 6th token for seq 1 (budget 5): the output is 6 long, as written."""
    trace = small()
    trace.steps[1].rows[1].emitted.append(308)
    trace.sequences[1].output_ids.append(308)
    assert outputs(check_trace(trace)) == [((1, 1, 1, "output_ids"), 5, 6, "sequence 1 has 6 tokens > its budget of 5")]


@pytest.mark.parametrize("eos,index,step", [(138, 1, 0), (120, 2, 1), (73, 3, 1)])
def test_output_continuing_after_an_eos_is_found_where_the_next_token_was_written(eos, index, step) -> None:
    """`eos` made an EOS id: seq 1's output [343, 138, 120, 73, 308] goes on after it (token
    `index`); tokens 0-2 were written at step 0, tokens 3-4 at step 1."""
    trace = small()
    trace.header.eos_token_ids = [eos]
    assert trace.sequences[1].output_ids[index] == eos
    assert outputs(check_trace(trace)) == [
        ((step, 1, 1, "output_ids"), "nothing after EOS", "tokens after EOS", "sequence 1 continues after EOS")
    ]


def test_output_checks_of_a_run_without_steps_stay_at_the_run() -> None:
    """No step to locate an output fault at: over the budget and after an EOS are not reported
    (no step wrote them), the sequences were never decoded."""
    trace = small()
    trace.steps = []
    for seq in trace.sequences:
        seq.output_ids = [5, 0, 5, 5, 5, 5]  # 6 > 5 tokens, and after the EOS 0
    report = check_trace(trace)
    assert [(v.step_index, v.row, v.seq_id, v.field) for v in report.violations] == [
        (-1, -1, 0, "seq_id"),
        (-1, -1, 1, "seq_id"),
    ]
    assert all("never decoded" in v.message for v in report.violations)


def test_one_sequence_in_two_rows_of_a_step() -> None:
    trace = small()
    twin = copy.deepcopy(trace.steps[0].rows[1])
    twin.row = 2
    trace.steps[0].rows.append(twin)
    twice = [v for v in check_trace(trace).violations if v.step_index == 0 and v.field == "seq_id"]
    assert [(where(v), v.invariant, v.message) for v in twice] == [
        ((0, 2, 1, "seq_id"), 4, "sequence 1 appears in two rows of one step")
    ]


def test_zero_length_mask_runs_are_no_runs() -> None:
    trace = small()
    for step in trace.steps:
        for row in step.rows:
            row.mask_rle = [[1, 0], *row.mask_rle[:1], [0, 0], *row.mask_rle[1:], [0, 0]]
    report = check_trace(trace)
    assert report.verdict == "clean", report.first_violation


def test_rows_of_one_step_must_have_one_mask_width_when_left_padded() -> None:
    """Step 0, row 1's mask gets one more padding slot: widths 10 and 11, flagged at row 0."""
    trace = small()
    trace.steps[0].rows[1].mask_rle = [[0, 1], [1, 10]]
    width = [v for v in check_trace(trace).violations if v.expected == "one width for all rows"]
    assert [(where(v), v.invariant, v.actual) for v in width] == [((0, 0, 0, "mask_rle"), 1, [10, 11])]
    trace.header.layout = "unspecified"  # rows may differ: padding on either side, ragged drafts
    assert not [v for v in check_trace(trace).violations if v.expected == "one width for all rows"]
