"""Mixed chunked prefill on EXSPEC (`--prefill-chunk N`): a waiting prompt's next chunk rides in the
running rows' verify forward (`engine/mixed.py`). Outputs stay token-exact against batch-1 greedy
across batch sizes, draft lengths, chunk sizes and prompt-length mixes; the trace shows chunks
carried by verify steps (`prefill_chunks`' fifth item, schema 5); the chunk-continuity checks pass
on the correct run and catch a wrong rider at its first (step, row)."""

from __future__ import annotations

import copy
import functools

import pytest
from exactness import PROMPTS, assert_exact, oracle, pair_for

from specviz.analysis.check import check_trace
from specviz.analysis.prefill_checks import carried_chunks
from specviz.engine.config import RunConfig
from specviz.engine.reference import greedy_reference
from specviz.engine.run import run
from specviz.trace.invariants import Invariant

MAX_NEW = 20  # exactness.MAX_NEW: the oracle's length
EQUAL = ["abcdefghij", "klmnopqrst", "uvwxyzABCD", "EFGHIJKLMN", "OPQRSTUVWX", "0123456789", "9876543210"]
SHORT = ["a", "hi", "ok", "z", "yes", "no", "The cat", "abc"]  # most shorter than one chunk
MIXES = {"ragged": tuple(PROMPTS), "equal": tuple(EQUAL), "short": tuple(SHORT)}


@functools.cache
def expected(mix: str, family: str = "llama") -> tuple:
    """Batch-1 greedy decoding of the target, per prompt of `mix`."""
    if mix == "ragged" and family == "llama":
        return oracle("llama")
    pair = pair_for(family)
    outs = []
    for text in MIXES[mix]:
        ids = pair.tokenizer(text)["input_ids"]
        outs.append(tuple(greedy_reference(pair.target, ids, MAX_NEW, frozenset([1]), pair.device)[0]))
    return tuple(outs)


@functools.cache
def record(
    batch: int,
    k: int,
    chunk: int,
    mix: str = "ragged",
    window: int | None = None,
    fault: str | None = None,
    temperature: float = 0.0,
    family: str = "llama",
    proposer: str = "draft-model",
):
    config = RunConfig(
        proposer=proposer,
        temperature=temperature,
        method="exspec",
        batch_size=batch,
        draft_k=k,
        max_new_tokens=MAX_NEW,
        prefill_chunk=chunk,
        exspec_window=window,
        fault=fault,
        kv_check_every=1,
        reference=False,
    )
    return run(pair_for(family), list(MIXES[mix]), config)


@pytest.mark.parametrize(
    ("batch", "k", "chunk", "mix", "window"),
    [
        (1, 1, 3, "ragged", None),
        (3, 2, 4, "ragged", None),
        (3, 4, 1, "short", None),
        (7, 3, 2, "ragged", 7),  # the window is the batch: a chunk rides only once a row finished
        (8, 4, 5, "ragged", None),
        (3, 1, 4, "equal", None),
        (3, 2, 16, "equal", None),  # one chunk longer than every prompt: a whole prefill, carried
        (4, 3, 2, "short", 4),
    ],
)
def test_mixed_exspec_is_exact_clean_and_carries_chunks(
    batch: int, k: int, chunk: int, mix: str, window: int | None
) -> None:
    trace = record(batch, k, chunk, mix, window)
    assert_exact(trace, expected(mix))
    report = check_trace(trace)
    assert report.violation_count == 0, report.first_violation
    carried = carried_chunks(trace)
    assert carried, "no chunk rode in a verify forward"
    first_step = {}
    for step in trace.steps:
        for row in step.rows:
            first_step.setdefault(row.seq_id, step.step)
            if row.prefill_chunks is not None:
                assert first_step[row.seq_id] == step.step  # recorded on the sequence's first step
                assert all(c[1] - c[0] <= chunk and len(c) == 5 for c in row.prefill_chunks)
                assert all(c[4] < step.step for c in row.prefill_chunks)
    steps = {s.step: s for s in trace.steps}
    for carrier, seq_id, _ in carried:  # a carrier is a verify step the sequence did not run in
        assert seq_id not in {r.seq_id for r in steps[carrier].rows}


def test_other_families_stay_exact_with_mixed_chunks() -> None:
    trace = record(4, 3, 3, "ragged", family="gpt2")  # learned absolute positions
    assert_exact(trace, expected("ragged", "gpt2"))
    assert check_trace(trace).violation_count == 0 and carried_chunks(trace)


def test_ngram_drafting_mixes_too_and_a_head_keeps_its_own_chunk_forwards() -> None:
    """No draft model: chunks ride with nothing fed to a draft. A head reads the prefill's hidden
    states, so its chunks keep forwards of their own (carrier -1), still exact and clean."""
    ngram = record(4, 3, 3, proposer="ngram")
    assert_exact(ngram, oracle("llama"))
    assert check_trace(ngram).violation_count == 0 and carried_chunks(ngram)
    assert all(r.draft_prefill_tokens is None for s in ngram.steps for r in s.rows)
    from drafting import tiny_pair

    tiny_pair()  # the tiny pair with a head for its target
    head = record(4, 3, 3, proposer="head")
    assert_exact(head, oracle("llama"))
    assert check_trace(head).violation_count == 0 and not carried_chunks(head)
    assert any(r.prefill_chunks for s in head.steps for r in s.rows)


def test_sampled_mixed_exspec_matches_the_whole_prompt_run() -> None:
    """Coupled sampling is keyed by (seed, sequence, index): mixing the prefill changes no token."""
    mixed = record(5, 3, 3, temperature=0.9)
    whole = record(5, 3, 0, temperature=0.9)
    assert carried_chunks(mixed) and not carried_chunks(whole)
    assert outputs(mixed) == outputs(whole)
    assert check_trace(mixed).violation_count == 0


def outputs(trace) -> list[list[int]]:
    return [s.output_ids for s in sorted(trace.sequences, key=lambda s: s.seq_id)]


def test_chunk_boundary_feed_on_carried_chunks_is_caught_at_its_first_step_and_row() -> None:
    trace = record(4, 3, 3, fault="chunk-boundary-feed")
    assert carried_chunks(trace)
    events = trace.header.fault_events
    assert events, "the fault never fired"
    first_event = min(events, key=lambda e: (e["step"], e["row"]))
    first = check_trace(trace).first_violation
    assert (first.step, first.row, first.seq_id) == (first_event["step"], first_event["row"], first_event["seq_id"])
    assert (first.invariant, first.field) == (Invariant.DRAFT_INPUT, "draft_prefill_tokens")
    assert_exact(trace, oracle("llama"))  # the target's cache is right: only the invariant sees it


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_rider_fed_the_mixed_batch_positions_is_caught_at_its_first_step_and_row(temperature: float) -> None:
    """The `rider-position` fault: a carried chunk's positions from its column in the mixed batch."""
    trace = record(4, 3, 3, fault="rider-position", temperature=temperature)
    events = trace.header.fault_events
    assert events, "the fault never fired"
    first_event = min(events, key=lambda e: (e["step"], e["row"]))
    report = check_trace(trace)
    first = report.first_violation
    assert (first.step, first.row, first.seq_id) == (first_event["step"], first_event["row"], first_event["seq_id"])
    assert (first.invariant, first.field) == (Invariant.POSITIONS, "prefill_chunks")
    assert report.verdict == "desync"
    clean = record(4, 3, 3, temperature=temperature)  # the same settings without the fault
    assert check_trace(clean).violation_count == 0


def _first_carried_row(trace):
    """(step, row) of the first row recording a chunk that a verify forward carried."""
    for step in trace.steps:
        for row in step.rows:
            if any(c[4] >= 0 for c in row.prefill_chunks or ()):
                return step, row
    raise AssertionError("no carried chunk")


def test_a_rider_fed_off_position_or_a_late_carrier_is_caught_at_its_row() -> None:
    trace = copy.deepcopy(record(3, 2, 4))
    step, row = _first_carried_row(trace)
    chunk = next(c for c in row.prefill_chunks if c[4] >= 0)
    chunk[2] += 1  # the rider's chunk fed one position too far
    first = check_trace(trace).first_violation
    assert (first.step, first.row, first.invariant, first.field) == (
        step.step,
        row.row,
        Invariant.POSITIONS,
        "prefill_chunks",
    )
    chunk[2] -= 1
    chunk[4] = step.step  # carried by the sequence's own first step: impossible
    first = check_trace(trace).first_violation
    assert (first.step, first.row, first.invariant) == (step.step, row.row, Invariant.KV)
    assert "not a step of the run before the sequence's first" in first.message


def test_a_chunk_carried_while_its_sequence_ran_is_flagged() -> None:
    """A record on a later step of the sequence (a re-prefill, say) whose carrier is a step it ran in."""
    trace = copy.deepcopy(record(3, 2, 4))
    step, row = _first_carried_row(trace)
    later = next(r for s in trace.steps if s.step > step.step + 1 for r in s.rows if r.seq_id == row.seq_id)
    later.prefill_chunks = [list(c) for c in row.prefill_chunks]
    later.prefill_chunks[-1][4] = step.step  # its first step: it was running then
    messages = [v.message for v in check_trace(trace).violations if v.row == later.row and v.seq_id == row.seq_id]
    assert any("while the sequence itself was running" in m for m in messages), messages
