"""The repetition penalty (`--repetition-penalty`): every method is token-exact against
transformers' own batch-1 `generate(repetition_penalty=...)` (the independent oracle) across batch
sizes, draft lengths and the mixed prompt lengths, greedy; coupled sampling is exact against the
coupled batch-1 reference, which penalises with transformers' processor too. The trace records
each sequence's penalty history and the sampling-state check holds on every row; the
penalty-history fault (one token a step, SGLang PR #33643 / vLLM #30122) is caught at its first
(step, row) and changes outputs only with the penalty on."""

from __future__ import annotations

import functools

import pytest
import torch
from exactness import PROMPTS, pair_for

from specviz.analysis.check import check_trace
from specviz.engine.config import RunConfig
from specviz.engine.run import run
from specviz.errors import SpecvizError
from specviz.trace.invariants import Invariant

PENALTY = 1.5
MAX_NEW = 12


@functools.cache
def generated(penalty: float = PENALTY) -> tuple[tuple[int, ...], ...]:
    """transformers' batch-1 greedy `generate` with its repetition penalty, prompt by prompt."""
    pair = pair_for("llama")
    outs = []
    for text in PROMPTS:
        ids = torch.tensor([pair.tokenizer(text)["input_ids"]])
        out = pair.target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            repetition_penalty=penalty,
            max_new_tokens=MAX_NEW,
            eos_token_id=1,
            pad_token_id=0,
        )
        new = out[0, ids.shape[1] :].tolist()
        outs.append(tuple(new[: new.index(1) + 1] if 1 in new else new))
    return tuple(outs)


@functools.cache
def record(method: str, batch: int, k: int, penalty: float = PENALTY, temperature: float = 0.0, fault=None):
    config = RunConfig(
        method=method,
        batch_size=batch,
        draft_k=k,
        max_new_tokens=MAX_NEW,
        repetition_penalty=penalty,
        temperature=temperature,
        fault=fault,
        reference=temperature > 0,  # greedy runs are judged against transformers' generate below
    )
    return run(pair_for("llama"), PROMPTS, config)


def outputs(trace) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(s.output_ids) for s in sorted(trace.sequences, key=lambda s: s.seq_id))


def test_the_penalty_changes_the_oracle() -> None:
    """Otherwise every exactness test below would pass with the penalty ignored."""
    assert generated() != generated(1.0)


@pytest.mark.parametrize(
    ("method", "batch", "k"),
    [("baseline", 5, 0), ("eqspec", 1, 3), ("eqspec", 5, 2), ("eqspec", 16, 4), ("exspec", 5, 3), ("inplace", 7, 3)],
)
def test_every_method_is_exact_against_transformers_generate(method: str, batch: int, k: int) -> None:
    trace = record(method, batch, k)
    assert outputs(trace) == generated()
    report = check_trace(trace)
    assert report.violation_count == 0 and report.verdict in ("clean", "unexplained")  # no reference kept
    assert trace.header.sampling.repetition_penalty == PENALTY


def test_coupled_sampling_with_the_penalty_is_exact_against_the_coupled_reference() -> None:
    trace = record("eqspec", 5, 3, penalty=4.0, temperature=0.5)
    report = check_trace(trace)
    assert (report.verdict, report.violation_count, report.exact_match) == ("clean", 0, 1.0)
    assert outputs(trace) != outputs(record("eqspec", 5, 3, penalty=1.0, temperature=0.5))


def test_the_trace_records_the_history_as_prompt_plus_emitted() -> None:
    trace = record("eqspec", 5, 3)
    prompts = {s.seq_id: s.prompt_ids for s in trace.sequences}
    history = {seq_id: list(ids) for seq_id, ids in prompts.items()}
    for step in trace.steps:
        for row in step.rows:
            assert row.penalty_history_len == len(history[row.seq_id]) == row.committed_before
            history[row.seq_id] += row.penalty_added
    for seq in trace.sequences:
        assert history[seq.seq_id] == seq.prompt_ids + seq.output_ids


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_penalty_history_fault_is_caught_at_its_first_step_and_row(temperature: float) -> None:
    trace = record("eqspec", 5, 3, temperature=temperature, fault="penalty-history")
    events = trace.header.fault_events
    assert events, "the fault never fired"
    first_event = min(events, key=lambda e: (e["step"], e["row"]))
    report = check_trace(trace)
    first = report.first_violation
    assert (first.step, first.row, first.seq_id) == (first_event["step"], first_event["row"], first_event["seq_id"])
    assert (first.invariant, first.field) == (Invariant.SAMPLING_STATE, "penalty_added")
    # No tensor of the step desyncs: the only broken invariant is the sampling state.
    assert {v.invariant for v in report.violations} == {Invariant.SAMPLING_STATE}


def test_penalty_history_fault_changes_outputs_only_with_the_penalty_on() -> None:
    assert outputs(record("eqspec", 5, 3, fault="penalty-history")) != generated()
    with pytest.raises(SpecvizError, match="repetition-penalty"):
        RunConfig(fault="penalty-history").validate()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"repetition_penalty": 0.0}, "finite number > 0"),
        ({"repetition_penalty": float("nan")}, "finite number > 0"),
        ({"repetition_penalty": 1.2, "tree_branches": 1}, "chains"),
        ({"repetition_penalty": 1.2, "temperature": 0.8, "sampling": "rejection"}, "rejection"),
    ],
)
def test_unsupported_penalty_settings_are_refused_in_one_line(settings: dict, message: str) -> None:
    with pytest.raises(SpecvizError, match=message):
        RunConfig(**settings).validate()
