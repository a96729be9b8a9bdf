"""The checker against traces whose faults we know: synthetic mutations and tiny-model runs.

More of the checker's cases: how runs end (`test_check_endings.py`), the optional state fields
(`test_check_state.py`) and hand-sized traces (`test_check_hand_sized.py`)."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import pytest
from edited_traces import clean_synth, first, mutated
from tiny import make_pair

from specviz.analysis.check import MARGIN_THRESHOLDS, check_trace
from specviz.engine.faults import FAULTS
from specviz.engine.run import RunConfig, greedy_references, run, tokenize_prompts
from specviz.trace.io import save_trace
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
# penalty's, a repetition penalty: tests/engine/test_repetition_penalty.py; chunked prefill's,
# --prefill-chunk: tests/engine/test_chunked_prefill.py and test_mixed_prefill.py.
CHAIN_FAULTS = [
    f
    for f in sorted(FAULTS)
    if not (FAULTS[f].needs_proposer or FAULTS[f].needs_tree or FAULTS[f].needs_penalty or FAULTS[f].needs_chunks)
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
