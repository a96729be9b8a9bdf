"""Chunked prefill (`--prefill-chunk N`): every method that takes it stays token-exact against
batch-1 greedy decoding across batch sizes, draft lengths, chunk sizes and the mixed prompt
lengths; the trace records each sequence's chunks, which tile its context in order at the right
positions and attended widths, and what its draft was fed; the chunk-boundary-feed fault (SGLang
PR #26329) is caught at its first (step, row) with outputs exact."""

from __future__ import annotations

import functools

import pytest
from exactness import PROMPTS, assert_exact, oracle, pair_for

from specviz.analysis.check import check_trace
from specviz.engine.config import RunConfig
from specviz.engine.run import run
from specviz.errors import SpecvizError
from specviz.trace.invariants import Invariant

MAX_NEW = 20  # exactness.MAX_NEW: the oracle's length


@functools.cache
def record(
    method: str,
    batch: int,
    k: int,
    chunk: int,
    fault: str | None = None,
    proposer: str = "draft-model",
    temperature: float = 0.0,
):
    config = RunConfig(
        temperature=temperature,
        method=method,
        batch_size=batch,
        draft_k=k,
        max_new_tokens=MAX_NEW,
        prefill_chunk=chunk,
        fault=fault,
        proposer=proposer,
        kv_check_every=1,
        reference=False,
    )
    return run(pair_for("llama"), PROMPTS, config)


@pytest.mark.parametrize(
    ("method", "batch", "k", "chunk"),
    [
        ("baseline", 5, 0, 4),
        ("eqspec", 1, 3, 2),
        ("eqspec", 6, 2, 1),
        ("eqspec", 16, 4, 7),
        ("exspec", 5, 3, 3),
        ("exspec", 8, 4, 64),  # one chunk longer than every prompt: a whole prefill
        ("inplace", 1, 2, 3),
        ("inplace", 6, 3, 2),  # fixed regions: each chunk fills slots start .. of its rows' regions
        ("inplace", 16, 4, 5),
    ],
)
def test_every_method_is_exact_and_clean_with_chunked_prefill(method: str, batch: int, k: int, chunk: int) -> None:
    trace = record(method, batch, k, chunk)
    assert_exact(trace, oracle("llama"))
    assert check_trace(trace).violation_count == 0
    assert trace.header.options["prefill_chunk"] == chunk


@pytest.mark.parametrize("method", ["eqspec", "inplace"])
def test_head_drafting_reads_the_hidden_states_of_every_chunk(method: str) -> None:
    from drafting import tiny_pair

    tiny_pair()  # the tiny pair with a head for its target (the embedded head is the default target's)
    trace = record(method, 6, 3, 3, proposer="head")
    assert_exact(trace, oracle("llama"))
    assert check_trace(trace).violation_count == 0


@pytest.mark.parametrize("method", ["eqspec", "inplace"])
def test_the_chunks_tile_each_context_at_most_n_tokens_at_a_time(method: str) -> None:
    chunk = 3
    trace = record(method, 6, 3, chunk)
    prompts = {s.seq_id: s.prompt_ids for s in trace.sequences}
    seen = set()
    for step in trace.steps:
        for row in step.rows:
            if row.prefill_chunks is None:
                continue
            seen.add(row.seq_id)
            context = len(prompts[row.seq_id]) - 1
            ends = [0] + [c[1] for c in row.prefill_chunks]  # a one-token prompt caches nothing: no chunk
            assert ends[-1] == context and all(c[1] - c[0] <= chunk for c in row.prefill_chunks)
            assert all(c[0] == c[2] == c[3] for c in row.prefill_chunks)  # start, position, slots before
            assert row.draft_prefill_tokens == prompts[row.seq_id][:-1]
    assert seen == {s.seq_id for s in trace.sequences}


@pytest.mark.parametrize(
    ("method", "temperature"), [("eqspec", 0.0), ("exspec", 0.0), ("inplace", 0.0), ("eqspec", 0.9)]
)
def test_chunk_boundary_feed_is_caught_at_its_first_step_and_row_with_outputs_exact(
    method: str, temperature: float
) -> None:
    trace = record(method, 6, 3, 4, fault="chunk-boundary-feed", temperature=temperature)
    events = trace.header.fault_events
    assert events, "the fault never fired"
    first_event = min(events, key=lambda e: (e["step"], e["row"]))
    report = check_trace(trace)
    first = report.first_violation
    assert (first.step, first.row, first.seq_id) == (first_event["step"], first_event["row"], first_event["seq_id"])
    assert (first.invariant, first.field) == (Invariant.DRAFT_INPUT, "draft_prefill_tokens")
    assert {v.invariant for v in report.violations} == {Invariant.DRAFT_INPUT}
    if temperature == 0:  # the target's cache is right: caught by the invariant only
        assert_exact(trace, oracle("llama"))
    else:  # sampled: the same outputs as the correct engine under the same settings and keys
        assert sampled_outputs(trace) == sampled_outputs(record(method, 6, 3, 4, temperature=temperature))


def sampled_outputs(trace) -> list[list[int]]:
    return [s.output_ids for s in sorted(trace.sequences, key=lambda s: s.seq_id)]


def test_a_chunked_trace_checks_the_same_from_parquet(tmp_path) -> None:
    from specviz.trace.io import open_trace, save_trace

    trace = record("eqspec", 6, 3, 4, fault="chunk-boundary-feed")
    again = open_trace(save_trace(trace, tmp_path / "t.parquet"))
    assert check_trace(again).to_dict() == check_trace(trace).to_dict()


def test_a_broken_chunk_record_is_reported_with_its_invariant() -> None:
    import copy

    trace = copy.deepcopy(record("eqspec", 6, 3, 3))
    row = next(r for step in trace.steps for r in step.rows if r.prefill_chunks and len(r.prefill_chunks) > 1)
    row.prefill_chunks[1][2] += 1  # the second chunk fed one position too far
    first = check_trace(trace).first_violation
    assert (first.invariant, first.field, first.seq_id) == (Invariant.POSITIONS, "prefill_chunks", row.seq_id)
    row.prefill_chunks[1][2] -= 1
    del row.prefill_chunks[1]  # a chunk missing: the next starts where it should have ended
    first = check_trace(trace).first_violation
    assert (first.invariant, first.field, first.seq_id) == (Invariant.KV, "prefill_chunks", row.seq_id)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"prefill_chunk": -1}, "0 \\(whole prompts\\) or more"),
        ({"fault": "chunk-boundary-feed"}, "--prefill-chunk"),
    ],
)
def test_unsupported_chunk_settings_are_refused_in_one_line(settings: dict, message: str) -> None:
    with pytest.raises(SpecvizError, match=message):
        RunConfig(**settings).validate()
