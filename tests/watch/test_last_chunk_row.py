"""A prompt's last chunk read by the command, in a run with no draft model (`zoo/chunkmix.py`, n-gram
drafts): its row holds prompt tokens only, its last token the pending one, no drafts, though its
first token is the token the prompt ends with. The prompt [78, 16, 43, 6, 5, 6] fed 3 tokens a
forward: the last chunk [6, 5, 6] starts with the 6 the prompt ends with, where a verify row's
pending token sits (the first slot after its cache). Read as a verify row, it carries drafts
[5, 6] and the step reads as a position and a KV bug on a correct engine.

Pinned at the step the trace holds, whichever stage reads it: today the inferrer says the row
carries no drafts (`infer.gains.Gains._chunked`, which rewrites the call's map); the same
reading can come from `calls.draft_free_query` itself (its last slot follows every committed token:
the pending one), after which the map rewrite can go."""

from __future__ import annotations

from zoo.command import watch_script

from specviz.analysis.check import check_trace

PROMPTS = [[78, 16, 43, 6, 5, 6], [86, 72, 4, 51, 90], [30, 57, 95]]
BUDGETS = [8, 10, 8]
OPTIONS = {"chunk": 3, "gap": 2}


def test_a_last_chunk_that_starts_with_the_prompts_last_token_carries_no_drafts(tmp_path) -> None:
    trace, outs, events = watch_script(tmp_path / "chunkmix.trace.json", "chunkmix", PROMPTS, BUDGETS, options=OPTIONS)
    assert not events
    first = next(row for step in trace.steps for row in step.rows if row.seq_id == 0)
    # The step of the last chunk: after the whole prompt, its last token pending at position 5,
    # attending the 5 prompt tokens before it, and the target's choice after it the one token.
    assert (first.committed_before, first.pending_token, first.draft_tokens) == (6, 6, [])
    assert (first.position_ids, first.kv_len, first.kv_len_expected) == ([5], 5, 5)
    assert first.emitted == outs[0][:1] == [28]
    report = check_trace(trace)
    assert report.verdict == "clean" and report.exact_match == 1.0, report.violations[:3]
