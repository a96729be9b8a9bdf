"""Every fault on the embedded default pair: caught as desync at exactly the (step, row) where it
first altered state (from the fault's own log, which the checker never reads); the faults that
real engines only hit in ragged batches pass at batch 1; correct runs raise no false alarm."""

from __future__ import annotations

import functools

import pytest

from specviz.analysis.check import check_trace
from specviz.data import load_specbench
from specviz.engine.faults import FAULTS
from specviz.engine.models import load_pair
from specviz.engine.run import RunConfig, greedy_references, run, tokenize_prompts
from specviz.trace.token_text import attach_token_text

# Held-out prompts (never seen in training) of very different lengths.
PROMPTS = [p for p in load_specbench("heldout") if len(p) < 1500][:16]
MAX_NEW = 24
RAGGED_ONLY = ("column-positions", "kv-row-copy", "pad-accumulation", "row-mixup", "stale-kv", "uniform-advance")
ALWAYS = ("draft-positions", "extra-accept", "masked-holes", "missing-bonus-kv")
# The faults of head and tree drafting and of request order, on tiny pairs: tests/engine/test_drafting_faults.py.
DRAFTING = ("request-order", "head-source-index", "shared-carry", "tree-sibling-mask", "tree-node-positions")
# The faults of state carried between steps (greedy and sampled, on the tiny pair):
# tests/engine/test_scheduling_faults.py.
SCHEDULING = ("stale-pending", "async-ahead", "mid-batch-pad", "stale-draft-map")
PENALTY = ("penalty-history",)  # needs --repetition-penalty: tests/engine/test_repetition_penalty.py
# need --prefill-chunk: tests/engine/test_chunked_prefill.py, tests/engine/test_mixed_prefill.py
CHUNKS = ("chunk-boundary-feed", "rider-position")
CHAIN_FAULTS = sorted(set(FAULTS) - set(DRAFTING) - set(SCHEDULING) - set(PENALTY) - set(CHUNKS))


@functools.cache
def pair():
    return load_pair(device="cpu")


@functools.cache
def references() -> tuple[tuple[tuple[int, ...], tuple[float, ...]], ...]:
    """The batch-1 greedy oracle (tokens, margins) of every prompt, decoded once by the function
    `run` decodes it with: every run below would decode the same 16 x 24 tokens again (27 runs)."""
    ids = tokenize_prompts(pair(), PROMPTS, MAX_NEW)
    return tuple((tuple(t), tuple(m)) for t, m in greedy_references(pair(), ids, MAX_NEW))


@functools.cache
def record(method: str, fault: str | None, batch: int, num_prompts: int = len(PROMPTS), kv_check_every: int = 1):
    cfg = RunConfig(
        method=method,
        fault=fault,
        batch_size=batch,
        draft_k=4,
        max_new_tokens=MAX_NEW,
        kv_check_every=kv_check_every,  # tests check the KV content at every step
        reference=False,  # the shared oracle is attached below: the trace `reference=True` writes
    )
    trace = run(pair(), PROMPTS[:num_prompts], cfg)
    for seq in trace.sequences:  # sequence i is prompt i (a greedy oracle does not depend on the run)
        seq.reference_ids, seq.reference_margins = map(list, references()[seq.seq_id])
    return attach_token_text(trace, pair().tokenizer)  # the references' tokens too, as `run` attaches them


def test_fault_lists_cover_the_catalogue() -> None:
    assert sorted(RAGGED_ONLY + ALWAYS + DRAFTING + SCHEDULING + PENALTY + CHUNKS) == sorted(FAULTS)


@pytest.mark.parametrize("fault", CHAIN_FAULTS)
def test_fault_is_desync_first_violation_where_it_fired(fault: str) -> None:
    trace = record(FAULTS[fault].default_method, fault, 8)
    events = trace.header.fault_events
    assert events, f"{fault} never fired on the default pair"
    report = check_trace(trace)
    assert report.verdict == "desync"
    first = report.first_violation
    assert (first.step, first.row, first.seq_id) == (events[0]["step"], events[0]["row"], events[0]["seq_id"])
    at_first = {v.invariant for v in report.violations if (v.step, v.row) == (first.step, first.row)}
    documented = set(FAULTS[fault].invariants)
    assert at_first & documented, f"{fault}: broke {at_first}, documented {documented}"


@pytest.mark.parametrize("fault", RAGGED_ONLY)
def test_ragged_only_faults_are_harmless_at_batch_1(fault: str) -> None:
    trace = record(FAULTS[fault].default_method, fault, 1, num_prompts=6)
    report = check_trace(trace)
    assert trace.header.fault_events == []
    assert report.verdict == "clean" and report.exact_match == 1.0


@pytest.mark.parametrize("fault", ALWAYS)
def test_other_faults_break_even_at_batch_1(fault: str) -> None:
    trace = record(FAULTS[fault].default_method, fault, 1, num_prompts=6)
    assert trace.header.fault_events
    assert check_trace(trace).verdict == "desync"


@pytest.mark.parametrize("method", ["baseline", "eqspec", "exspec"])
def test_correct_methods_are_clean_and_exact(method: str) -> None:
    report = check_trace(record(method, None, 8))
    assert report.verdict == "clean" and report.violation_count == 0
    assert report.exact_match == 1.0


def test_faults_corrupt_text_not_only_state() -> None:
    """Every output-corrupting fault changes tokens on the default pair (all four, not most)."""
    corrupting = ("extra-accept", "row-mixup", "uniform-advance", "pad-accumulation")
    broken = [f for f in corrupting if check_trace(record(FAULTS[f].default_method, f, 8)).exact_match < 1.0]
    assert broken == list(corrupting)


def test_kv_row_copy_is_seen_only_by_the_kv_content_check() -> None:
    fault = "kv-row-copy"
    checked = check_trace(record(FAULTS[fault].default_method, fault, 8))
    assert checked.violations and {v.field for v in checked.violations} == {"kv_mismatch_slot"}
    unchecked = check_trace(record(FAULTS[fault].default_method, fault, 8, kv_check_every=0))
    assert unchecked.violation_count == 0 and unchecked.verdict in ("clean", "unexplained")


def test_draft_positions_fault_keeps_outputs_exact_and_is_found_at_its_first_step() -> None:
    trace = record(FAULTS["draft-positions"].default_method, "draft-positions", 8)
    report = check_trace(trace)
    assert report.exact_match == 1.0 and report.verdict == "desync"
    first = report.first_violation
    assert (first.step, first.field) == (0, "draft_position_ids")
