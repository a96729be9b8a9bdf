"""Sampling at temperature > 0.

Coupled mode: noise keyed by (seed, seq_id, logical index) makes batched speculative sampling
token-exact against batch-1 sampling with the same keys, so every invariant, fault and verdict of
the greedy engine applies unchanged. Rejection mode: distribution-exact, shown by a chi-square test
of the first emitted token at a fixed context against the target's distribution, which a wrong
acceptance rule fails.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from catalogue import ORIGINAL_FAULTS
from exactness import PROMPTS, pair_for
from tiny import make_pair

from specviz.analysis.check import MARGIN_THRESHOLDS, check_trace
from specviz.analysis.distribution import chi_square_sf, chi_square_test
from specviz.engine.batch import SeqState
from specviz.engine.faults import FAULTS
from specviz.engine.reference import sampled_reference
from specviz.engine.rules import TokenRules
from specviz.engine.run import RunConfig, run
from specviz.engine.sampling import SamplingParams, keyed_uniform, probabilities
from specviz.engine.step import Engine, EngineConfig

T = 0.8
SEED = 5
MAX_NEW = 16
CATALOGUE = ORIGINAL_FAULTS


@functools.cache
def coupled_oracle(top_p: float = 1.0, top_k: int = 0) -> tuple:
    pair = pair_for("llama")
    params = SamplingParams("coupled", T, top_p, top_k, SEED)
    outs = []
    for seq_id, text in enumerate(PROMPTS):
        ids = pair.tokenizer(text)["input_ids"]
        outs.append(tuple(sampled_reference(pair.target, ids, MAX_NEW, frozenset([1]), pair.device, params, seq_id)[0]))
    return tuple(outs)


def sample(method: str, batch: int = 8, k: int = 4, **extra):
    cfg = RunConfig(
        method=method,
        batch_size=batch,
        draft_k=k,
        max_new_tokens=MAX_NEW,
        temperature=T,
        seed=SEED,
        reference=False,
        **extra,
    )
    return run(pair_for("llama"), PROMPTS, cfg)


def test_noise_depends_on_its_key_only() -> None:
    seq_ids = torch.tensor([4, 9, 4])
    indices = torch.tensor([[7, 8], [7, 8], [30, 31]])
    batch = keyed_uniform(SEED, 0, seq_ids, indices, 96)
    alone = keyed_uniform(SEED, 0, torch.tensor([9]), torch.tensor([[8]]), 96)
    assert torch.equal(batch[1, 1], alone[0, 0])
    assert not torch.equal(batch[0, 0], batch[1, 0]), "another sequence, other noise"
    assert not torch.equal(batch[0, 0], keyed_uniform(SEED + 1, 0, seq_ids, indices, 96)[0, 0])
    assert 0 < float(batch.min()) and float(batch.max()) < 1


@pytest.mark.parametrize("method", ["eqspec", "exspec"])
def test_coupled_sampling_is_token_exact(method: str) -> None:
    trace = sample(method)
    expected = coupled_oracle()
    for seq in trace.sequences:
        assert tuple(seq.output_ids) == expected[seq.seq_id], f"sequence {seq.seq_id} diverged"
    accepted = [r.accepted for s in trace.steps for r in s.rows]
    assert 0 < sum(accepted) < 4 * len(accepted), "acceptance must be ragged"
    assert trace.header.sampling.mode == "coupled" and trace.header.sampling.temperature == T
    assert check_trace(trace).verdict == "clean"


def test_coupled_sampling_with_filters_is_exact_and_differs_from_greedy() -> None:
    trace = sample("eqspec", batch=5, k=3, top_p=0.9, top_k=20)
    expected = coupled_oracle(0.9, 20)
    assert [tuple(s.output_ids) for s in trace.sequences] == list(expected)
    assert expected != coupled_oracle(), "the filters change what is sampled"


def test_recorded_reference_and_margins_at_temperature() -> None:
    cfg = RunConfig(method="eqspec", batch_size=8, draft_k=4, max_new_tokens=MAX_NEW, temperature=T, seed=SEED)
    trace = run(pair_for("llama"), PROMPTS[:4], cfg)
    report = check_trace(trace)
    assert report.verdict == "clean" and report.exact_match == 1.0
    assert report.margin_threshold == pytest.approx(MARGIN_THRESHOLDS["float32"] / T)
    for seq in trace.sequences:
        assert seq.reference_ids == list(coupled_oracle()[seq.seq_id])
        assert all(m >= 0 for m in seq.reference_margins)


@pytest.mark.parametrize("fault", CATALOGUE)
def test_fault_found_where_it_fired_at_temperature(fault: str) -> None:
    cfg = RunConfig(
        method=FAULTS[fault].default_method,
        fault=fault,
        batch_size=8,
        draft_k=4,
        max_new_tokens=10,
        temperature=T,
        seed=1,
        reference=False,
    )
    trace = run(pair_for("llama"), PROMPTS[:12], cfg)
    events = trace.header.fault_events
    assert events, f"{fault} never fired at T={T}"
    report = check_trace(trace)
    assert report.verdict == "desync"
    first = report.first_violation
    assert (first.step, first.row, first.seq_id) == (events[0]["step"], events[0]["row"], events[0]["seq_id"])


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -1.0},
        {"temperature": float("nan")},
        {"temperature": 0.5, "top_p": 0.0},
        {"temperature": 0.5, "top_k": -1},
        {"top_p": 0.9},
        {"sampling": "rejection"},
        {"temperature": 0.5, "sampling": "nucleus"},
    ],
)
def test_bad_sampling_options_are_refused_up_front(bad: dict) -> None:
    from specviz.errors import SpecvizError

    with pytest.raises(SpecvizError):
        RunConfig(**bad).validate()


# ---------------------------------------------------------------------- rejection sampling

CONTEXT = [5, 17, 40, 9]
SAMPLES = 2000


@functools.cache
def peaked_pair() -> tuple:
    """A target with sharper distributions than a random init gives, and a draft far from it."""
    from tiny import build, noisy_draft

    target = build("llama", 2, hidden=32, seed=1)
    with torch.no_grad():
        target.lm_head.weight.mul_(6)
    return target, noisy_draft(target, alpha=0.5, seed=11)


def first_tokens(ratio=None) -> tuple[list[int], list[float]]:
    """The first token emitted after CONTEXT by SAMPLES independent sequences (one key each)."""
    target, draft = peaked_pair()
    params = SamplingParams("rejection", 1.0, 1.0, 0, SEED)
    rules = TokenRules(params) if ratio is None else TokenRules(params, ratio)
    seqs = [SeqState(i, list(CONTEXT)) for i in range(SAMPLES)]
    engine = Engine(EngineConfig(target, draft, 3, 1, frozenset([1]), 0, torch.device("cpu"), rules=rules))
    from specviz.engine.methods.eqspec import run_eqspec

    run_eqspec(engine, seqs, 1000)
    with torch.no_grad():
        probs = probabilities(target(torch.tensor([CONTEXT])).logits[:, -1:], params)[0, 0]
    return [s.output_ids[0] for s in seqs], probs.tolist()


def test_chi_square_survival_matches_known_quantiles() -> None:
    assert chi_square_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi_square_sf(18.307038053275146, 10) == pytest.approx(0.05, rel=1e-9)
    assert chi_square_sf(124.34211340400407, 100) == pytest.approx(0.05, rel=1e-9)
    assert chi_square_sf(0.5, 2) == pytest.approx(math.exp(-0.25), rel=1e-12)
    assert chi_square_test([0, 0, 0], [0.0, 1.0]).p_value == 0.0, "an impossible sample fails"


def test_rejection_sampling_passes_its_distribution_test() -> None:
    samples, probs = first_tokens()
    result = chi_square_test(samples, probs)
    assert result.samples >= 2000 and result.passes(), result


@pytest.mark.parametrize(
    "wrong",
    [
        lambda p_x, q_x: (q_x / p_x).clamp(max=1.0),  # the ratio upside down
        lambda p_x, q_x: torch.ones_like(p_x),  # accept every draft
    ],
    ids=["inverted-ratio", "always-accept"],
)
def test_wrong_acceptance_rule_fails_the_distribution_test(wrong) -> None:
    samples, probs = first_tokens(wrong)
    assert not chi_square_test(samples, probs).passes()


def test_rejection_run_is_checked_for_what_can_be_checked() -> None:
    cfg = RunConfig(
        method="exspec", batch_size=8, draft_k=4, max_new_tokens=MAX_NEW, temperature=T, sampling="rejection"
    )
    trace = run(make_pair("llama"), PROMPTS[:8], cfg)
    assert trace.header.sampling.mode == "rejection"
    assert all(seq.reference_ids is None for seq in trace.sequences), "no token-exact reference exists"
    report = check_trace(trace)
    assert report.violation_count == 0 and report.verdict == "clean"
    assert any("rejection sampling" in s for s in report.skipped_checks)
    accepted = [r.accepted for s in trace.steps for r in s.rows]
    assert 0 < sum(accepted) < 4 * len(accepted)
    assert all(len(s.output_ids) == MAX_NEW or s.finish_reason == "eos" for s in trace.sequences)
