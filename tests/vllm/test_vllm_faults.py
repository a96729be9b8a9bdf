"""Real bugs injected into vLLM (tests/support/vllm_faults.py) are found where they first broke.

Each fault logs where it changed vLLM's decision (runner step, batch row, request); the check,
reading only the trace, must name that step and request first, with the invariant the bug breaks.
A draft call at runner step s proposes the drafts verified at step s + 1: a drafting bug shows on
the row of step s + 1 whose drafts it made.
"""

from vllm_faults import inject

from specviz.analysis.check import check_trace
from specviz.trace.invariants import Invariant


def _first(trace):
    report = check_trace(trace)
    assert report.violations, "the fault fired but the check found nothing"
    v = report.first_violation
    return v.step, v.seq_id, v.invariant


def _seq(trace, req_id):
    return {r: int(s) for s, r in trace.header.options["vllm_requests"].items()}[req_id]


def _full(row):
    """The draft_kv_lens of a row whose every attended draft slot holds what it should."""
    start = row.committed_before - 1
    return list(range(start, start + len(row.draft_kv_lens)))


def _run(llms, method, fault, monkeypatch, **kwargs):
    from vllm_runs import watched

    with monkeypatch.context() as patch:
        log = inject(fault, patch, **kwargs)
        trace = watched(llms(method))
    assert log.events, f"{fault} never fired"
    return trace, log


def test_batch_order_from_dict_keys(llms, monkeypatch):
    """vLLM PR #14645: rows take the spans of other rows once a finished request's row is refilled
    (n-gram drafts make the counts differ). The first such row attends slots that do not hold its
    own tokens: KV, then its accounting."""
    trace, log = _run(llms, "ngram", "batch-order", monkeypatch)
    step, row, req_id = log.events[0]
    assert step > 0  # the orders agree until a request leaves the batch
    assert _first(trace) == (step, _seq(trace, req_id), Invariant.KV)
    broken = {(v.step, v.seq_id, v.invariant) for v in check_trace(trace).violations}
    assert (step, _seq(trace, req_id), Invariant.ACCOUNTING) in broken


def test_draft_slot_from_lagging_position(llms, monkeypatch):
    """vLLM #54498: one request's drafted KV written into its prompt slots (draft cache)."""
    trace, log = _run(llms, "draft_model", "draft-slot-lag", monkeypatch, lag_row=5)
    step, row, req_id = log.events[0]
    assert row == 5
    assert _first(trace) == (step + 1, _seq(trace, req_id), Invariant.KV)


def test_draft_positions_advanced_before_forward(llms, monkeypatch):
    """SGLang PR #25015: every later draft call fed one position ahead."""
    trace, log = _run(llms, "draft_model", "draft-position-early", monkeypatch)
    step, row, req_id = log.events[0]
    assert _first(trace) == (step + 1, _seq(trace, req_id), Invariant.POSITIONS)


def test_stale_token_map_across_draft_steps(llms, monkeypatch):
    """TensorRT-LLM PR #17240: later draft calls write KV into the blocks of the request that owned
    their row's token in the first pass. The first victim in batch order is the first flagged."""
    trace, log = _run(llms, "draft_model", "stale-token-map", monkeypatch)
    step = log.events[0][0]
    moved = {req for s, _, req in log.events if s == step}
    found = _first(trace)
    assert found[0] == step + 1 and found[2] == Invariant.KV
    rows = next(s for s in trace.steps if s.step == step + 1).rows
    flagged = [r.seq_id for r in rows if r.draft_kv_lens and r.draft_kv_lens != _full(r)]
    assert found[1] == flagged[0]
    assert {_seq(trace, r) for r in moved} <= set(flagged) | {rows[0].seq_id}


def test_stale_token_map_is_right_at_batch_one(llms, monkeypatch):
    """The same bug at batch 1: each first-pass token map is the identity, nothing moves."""
    from vllm_runs import watched

    with monkeypatch.context() as patch:
        log = inject("stale-token-map", patch)
        trace = watched(llms("draft_model"), prompts=["The capital of France is"], budgets=[16])
    assert log.events == []
    assert check_trace(trace).violations == []
