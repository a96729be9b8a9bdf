"""Correct vLLM runs under the watch are clean and exact, and the trace says what vLLM declared.

The oracle is batch-1 greedy decoding of the target by Hugging Face transformers (the trace's
reference_ids); vLLM runs 8 ragged prompts (two of equal length, one ended early by its own
max_tokens) with no speculation, n-gram, a draft model and an EAGLE head, its engine core in this
process.
"""

import pytest
from vllm_runs import BUDGETS, EARLY

from specviz.analysis.check import check_trace
from specviz.watch.vllm.steps import assemble

METHODS = ("none", "ngram", "draft_model", "eagle")


@pytest.fixture(scope="module")
def traces(llms):
    from vllm_runs import watched

    return {method: watched(llms(method)) for method in METHODS}


@pytest.mark.parametrize("method", METHODS)
def test_correct_run_is_clean_and_exact(traces, method):
    trace = traces[method]
    report = check_trace(trace)
    assert report.violations == [], report.violations[:3]
    assert report.verdict == "clean"
    assert len(trace.sequences) == 8
    for seq in trace.sequences:
        assert seq.reference_ids is not None
        assert seq.output_ids == seq.reference_ids, seq.seq_id
        assert len(seq.output_ids) == BUDGETS[seq.seq_id]
    assert trace.sequences[EARLY].finish_reason == "length"


@pytest.mark.parametrize("method", METHODS)
def test_trace_reads_what_vllm_declared(traces, method):
    trace = traces[method]
    header = trace.header
    assert header.layout == "unspecified" and header.library_versions["vllm"]
    assert header.draft_k == (0 if method == "none" else 3)
    proposers = {"none": "draft-model", "ngram": "ngram", "draft_model": "draft-model", "eagle": "head"}
    assert header.proposer == proposers[method]
    requests = header.options["vllm_requests"]
    assert sorted(requests) == [str(i) for i in range(8)] and len(set(requests.values())) == 8
    first = trace.steps[0]
    assert first.step == 0 and len(first.rows) == 8  # the prefill: every prompt, no drafts
    for row, seq in zip(first.rows, trace.sequences):
        assert row.committed_before == len(seq.prompt_ids) and row.draft_tokens == []
        assert row.position_ids == [len(seq.prompt_ids) - 1] and row.kv_len == len(seq.prompt_ids) - 1
    drafted = [row for step in trace.steps[1:] for row in step.rows]
    if method == "draft_model":  # every draft call's position and attended slots were read
        assert all(row.draft_position_ids is not None for row in drafted if row.draft_tokens)
    else:
        assert all(row.draft_position_ids is None for row in drafted)
    if method in ("ngram", "draft_model"):  # the random EAGLE head may never be right
        assert any(row.accepted > 0 for row in drafted) and any(row.accepted < len(row.draft_tokens) for row in drafted)


def test_batch_maps_hold_vllms_slots(llms, tmp_path):
    """Every segment's KV writes are slots of its own block table at its own positions, and no
    live request writes a slot another reads: what the trace's masks summarise, on the maps."""
    from vllm import SamplingParams
    from vllm_runs import script_module

    from specviz.watch.vllm import capture
    from specviz.watch.vllm.trace import read_records

    params = [SamplingParams(temperature=0, max_tokens=b) for b in BUDGETS]
    capture.install(tmp_path)
    try:
        llms("draft_model").generate(script_module().PROMPTS, params, use_tqdm=False)
    finally:
        capture.uninstall()
    maps = assemble(read_records(tmp_path), maps=True).maps
    assert maps and all(m.readable and m.source == "vllm" for m in maps)
    for bmap in maps:
        owner = {}
        for seg in bmap.segments:
            for slot in seg.reads:
                owner.setdefault(slot, seg.request)
        for seg in bmap.segments:
            assert [seg.reads[p] for p in seg.positions] == list(seg.writes)
            assert all(owner[w] == seg.request for w in seg.writes)
            assert seg.drafts in (0, 3) and not seg.chunk


def test_min_tokens_masks_a_stop_token_in_the_oracle_too(llms, traces):
    """vLLM masks a request's stop tokens until it has min_tokens outputs. A stop token that greedy
    decoding chooses second is then not chosen: the oracle masks it alike, so the run is clean and
    exact (without the mask the oracle stopped there: a false alarm on a correct engine)."""
    from vllm import SamplingParams
    from vllm_runs import script_module

    from specviz.watch.vllm import VllmWatch

    plain = traces["none"].sequences[0].output_ids
    stop = plain[1]
    params = SamplingParams(temperature=0, max_tokens=8, min_tokens=4, stop_token_ids=[stop])
    with VllmWatch(name="vllm-min-tokens") as watch:
        llms("none").generate(script_module().PROMPTS[:1], [params], use_tqdm=False)
    (seq,) = watch.trace.sequences
    assert stop not in seq.output_ids[:4] and seq.output_ids[1] != stop  # vLLM did mask it
    assert seq.output_ids == seq.reference_ids
    report = check_trace(watch.trace)
    assert report.violations == [] and report.verdict == "clean"
