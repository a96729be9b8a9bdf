"""The checker on the optional state fields (schema version 2): checked when recorded, reported as
skipped when not, unmentioned where they cannot apply; the KV-content check across families."""

from __future__ import annotations

import copy

import pytest
from edited_traces import clean_synth, first
from tiny import make_pair

from specviz.analysis.check import check_trace
from specviz.engine.run import RunConfig, run
from specviz.trace.io import save_trace

PROMPTS = ["hello world", "a", "the quick brown fox jumps over the lazy dog", "xy"]  # ragged lengths


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


def test_a_slot_that_holds_another_key_is_named_with_its_token_index_past_holes() -> None:
    """The message names the token a slot stands for: the attended slots before it, so a hole (a
    rejected draft's masked slot) or padding before it is not counted."""
    trace = copy.deepcopy(clean_synth())
    row = trace.steps[3].rows[2]
    row.mask_rle = [[0, 2], [1, 5], [0, 3], [1, 4]]  # 2 pads, 5 tokens, 3 holes, then tokens 5..8
    row.kv_mismatch_slot = 11
    (violation,) = [v for v in check_trace(trace).violations if v.field == "kv_mismatch_slot"]
    assert violation.message.startswith("cache slot 11 (token 6) does not hold")


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
