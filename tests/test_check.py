"""The checker against traces whose faults we know: synthetic mutations and tiny-model runs."""

from __future__ import annotations

import copy
import functools
import json
import time

import pytest
from tiny import make_pair

from specviz.analysis.check import check_trace
from specviz.engine.faults import FAULTS
from specviz.engine.run import RunConfig, run
from specviz.trace.io import load_trace, save_trace
from specviz.trace.synthetic import synthetic_trace

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


def test_checker_handles_trace_without_masks() -> None:
    trace = copy.deepcopy(clean_synth())
    for step in trace.steps:
        for row in step.rows:
            row.mask_rle = []
    report = check_trace(trace)
    assert report.verdict == "clean"
    assert any("mask_rle" in s for s in report.skipped_checks)


def test_checker_speed_480_prompts_128_tokens_batch_8(tmp_path) -> None:
    trace = synthetic_trace(480, 8, 4, 128)
    path = save_trace(trace, tmp_path / "big.json.gz")
    started = time.perf_counter()
    report = check_trace(load_trace(path))
    elapsed = time.perf_counter() - started
    assert report.verdict == "clean"
    assert elapsed < 5.0 * 3, f"load + check took {elapsed:.1f}s"  # 5 s budget, slack for loaded CI


@functools.cache
def tiny_run(method: str, batch: int, k: int, fault: str | None = None):
    cfg = RunConfig(method=method, fault=fault, batch_size=batch, draft_k=k, max_new_tokens=16)
    return run(make_pair("llama"), PROMPTS, cfg)


@pytest.mark.parametrize(
    "method,batch,k", [("baseline", 4, 0), ("eqspec", 1, 2), ("eqspec", 8, 4), ("exspec", 3, 3), ("exspec", 8, 8)]
)
def test_correct_runs_have_no_false_alarms(method: str, batch: int, k: int) -> None:
    report = check_trace(tiny_run(method, batch, k))
    assert report.verdict == "clean", report.first_violation
    assert report.violation_count == 0


@pytest.mark.parametrize("fault", sorted(FAULTS))
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


def test_reduced_precision_near_tie_flips_are_numerical_not_desync() -> None:
    """Negative control: bf16 batched GEMMs flip near-ties; no invariant breaks, so `numerical`."""
    import torch

    pair = make_pair("llama")
    pair.target, pair.draft = pair.target.to(torch.bfloat16), pair.draft.to(torch.bfloat16)
    pair.dtype = torch.bfloat16
    trace = run(pair, PROMPTS * 2, RunConfig(method="eqspec", batch_size=8, draft_k=4, max_new_tokens=32))
    report = check_trace(trace)
    assert report.violation_count == 0
    flipped = [s for s in report.sequences if s.first_divergence is not None]
    assert flipped, "bf16 should flip at least one near-tie against the batch-1 reference"
    assert all(s.verdict == "numerical" and s.margin < report.margin_threshold for s in flipped)
    assert report.verdict == "numerical"
