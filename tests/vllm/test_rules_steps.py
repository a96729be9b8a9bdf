"""Runner records -> trace steps (`specviz/watch/vllm/steps.py`, docs/vllm.md section 3), on
records written by hand in the shape `capture.py` writes them: no vLLM needed.

The run: a draft model (`draft_model`), block size 4. Request a (prompt 5 6 7, max_tokens 4) sits
in blocks 2 and 3 (slots 8-15); request b (prompt 20 21, max_tokens 1) in block 5 (slots 20-23).
Step 0 prefills both; a commits 40, b commits 30 and ends by its budget. The draft model then
proposes a's drafts 41 42 in two calls (the first re-reads the prompt and 40 for a and b, the
second feeds 41 at position 4, a alone). Step 1 verifies them: the target chose 41, then 50, so a
commits 41 50. Step 2 feeds 50 (no drafts): a commits 60 and ends by its budget. Variants: three
drafts, a head method (EAGLE-like) whose draft calls are not judged, a forward the capture could
not read."""

from __future__ import annotations

import copy

from specviz.watch.vllm.steps import Request, assemble

ENGINE = {"vllm": "0.32.0", "model": "target", "method": "draft_model", "draft_model": "draft"}


def new(req_id: str, prompt: list[int], max_tokens: int | None) -> dict:
    return {"req_id": req_id, "prompt": prompt, "temperature": 0.0, "max_tokens": max_tokens, "min_tokens": 0,
            "stop_ids": [1]}  # fmt: skip


def fed(ids, positions, qsl, seq_lens, table, slots) -> dict:
    return {"input_ids": ids, "positions": positions, "query_start_loc": qsl, "seq_lens": seq_lens,
            "block_table": table, "slot_mapping": slots}  # fmt: skip


def no_drafts(batch: int) -> dict:
    return {"draft_token_ids": [], "num_draft_tokens": [0] * batch, "target_logits_indices": [],
            "bonus_logits_indices": list(range(batch))}  # fmt: skip


def record(step: int, news, req_ids, spec, target, argmax, sampled, draft_calls=()) -> dict:
    return {"format": 1, "step": step, "engine": ENGINE, "new": news, "block_size": 4, "kv_groups": 1,
            "req_ids": req_ids, "spec": spec, "fed": target, "argmax": argmax, "sampled": sampled,
            "draft_calls": list(draft_calls)}  # fmt: skip


def run() -> list[dict]:
    return [
        record(
            0, [new("a", [5, 6, 7], 4), new("b", [20, 21], 1)], ["a", "b"], no_drafts(2),
            fed([5, 6, 7, 20, 21], [0, 1, 2, 0, 1], [0, 3, 5], [3, 2], [[2], [5]], [8, 9, 10, 20, 21]),
            [40, 30], [[40], [30]],
            draft_calls=[
                fed([5, 6, 7, 40, 20, 21, 30], [0, 1, 2, 3, 0, 1, 2], [0, 4, 7], [4, 3], [[2], [5]],
                    [8, 9, 10, 11, 20, 21, 22]),
                fed([41], [4], [0, 1], [5], [[2, 3]], [12]),  # a alone
            ],
        ),
        record(
            1, [], ["a"],
            {"draft_token_ids": [41, 42], "num_draft_tokens": [2], "target_logits_indices": [0, 1],
             "bonus_logits_indices": [2]},
            fed([40, 41, 42], [3, 4, 5], [0, 3], [6], [[2, 3]], [11, 12, 13]),
            [41, 50, 51], [[41, 50]],
        ),
        record(2, [], ["a"], no_drafts(1), fed([50], [5], [0, 1], [6], [[2, 3]], [13]), [60], [[60]]),
    ]  # fmt: skip


def test_each_step_reads_what_the_runner_declared() -> None:
    out = assemble(run())
    assert [(r.seq, r.req_id, r.output, r.finish_reason) for r in out.requests] == [
        (0, "a", [40, 41, 50, 60], "length"),
        (1, "b", [30], "length"),
    ]
    assert out.k == 2 and out.notes == [] and out.unreadable == {}
    assert [(s.step, s.cache_len, s.query_len) for s in out.steps] == [(0, 2, 1), (1, 3, 3), (2, 5, 1)]
    # vLLM's records carry no timings: none is made up
    assert all((s.draft_ms, s.verify_ms, s.align_ms, s.total_ms) == (0.0, 0.0, 0.0, 0.0) for s in out.steps)
    a0, b0 = out.steps[0].rows
    assert (a0.row, a0.seq_id, a0.committed_before, a0.pending_token, a0.position_ids) == (0, 0, 3, 7, [2])
    assert (a0.draft_tokens, a0.target_tokens, a0.accepted, a0.bonus, a0.emitted) == ([], [40], 0, 40, [40])
    assert (a0.mask_rle, a0.kv_len, a0.kv_len_expected) == ([[1, 3]], 2, 2)
    assert (a0.finished, a0.finish_reason, a0.left_pad_after) == (False, None, 0)
    assert (b0.row, b0.seq_id, b0.committed_before, b0.pending_token, b0.position_ids) == (1, 1, 2, 21, [1])
    assert (b0.target_tokens, b0.emitted, b0.bonus, b0.mask_rle, b0.kv_len) == ([30], [30], 30, [[1, 2]], 1)
    assert (b0.finished, b0.finish_reason, b0.left_pad_after) == (True, "length", None)
    (a1,) = out.steps[1].rows
    assert (a1.committed_before, a1.pending_token, a1.position_ids) == (4, 40, [3, 4, 5])
    assert (a1.draft_tokens, a1.target_tokens, a1.accepted, a1.bonus, a1.emitted) == (
        [41, 42],
        [41, 50, 51],
        1,
        50,
        [41, 50],
    )
    assert (a1.mask_rle, a1.kv_len, a1.kv_len_expected, a1.finished) == ([[1, 6]], 3, 3, False)
    # The draft calls of step 0 proposed these drafts: the position of each call's last real token,
    # and how many of the n - 1 + j slots before it hold a's own tokens.
    assert (a1.draft_position_ids, a1.draft_kv_lens) == ([3, 4], [3, 4])
    assert (a1.draft_kv_len, a1.draft_kv_len_expected) == (3, 3)
    (a2,) = out.steps[2].rows
    assert (a2.committed_before, a2.pending_token, a2.position_ids, a2.emitted) == (6, 50, [5], [60])
    assert (a2.mask_rle, a2.kv_len, a2.kv_len_expected) == ([[1, 6]], 5, 5)
    assert (a2.finished, a2.finish_reason, a2.bonus, a2.draft_position_ids) == (True, "length", 60, None)


def test_a_budget_cut_below_the_sampled_tokens_leaves_no_bonus() -> None:
    """a's max_tokens 2: after 40 it has room for one token, so at step 1 it keeps 41 of the sampled
    41 50 (the draft it accepted) and ends by its budget; the bonus place's token is not kept."""
    records = run()
    records[0]["new"][0]["max_tokens"] = 2
    out = assemble(records[:2])
    (a1,) = out.steps[1].rows
    assert (a1.accepted, a1.emitted, a1.bonus, a1.finish_reason) == (1, [41], None, "length")


def test_the_draft_calls_show_a_slot_the_draft_model_never_wrote() -> None:
    """The first draft call skips slot 10 (position 2): a's later draft reads see two of their three
    context slots, then three of four."""
    records = run()
    call = records[0]["draft_calls"][0]
    call["slot_mapping"] = [8, 9, 30, 11, 20, 21, 22]  # position 2's KV written elsewhere
    (a1,) = assemble(records).steps[1].rows
    assert (a1.draft_kv_lens, a1.draft_kv_len, a1.draft_kv_len_expected) == ([2, 3], 2, 3)
    assert a1.draft_position_ids == [3, 4] and a1.kv_len == 3  # the target's own cache is whole


def test_a_prefix_cache_hit_is_taken_as_its_own_tokens() -> None:
    """Request c (prompt 5 6 7 9) finds its first three tokens in the prefix cache (blocks no step
    seen here wrote): its first step feeds 9 alone, and the slots it reads count as its own."""
    records = [
        record(
            0, [new("c", [5, 6, 7, 9], 2)], ["c"], no_drafts(1),
            fed([9], [3], [0, 1], [4], [[7]], [31]), [44], [[44]],
        )
    ]  # fmt: skip
    (c0,) = assemble(records).steps[0].rows
    assert (c0.committed_before, c0.pending_token, c0.position_ids) == (4, 9, [3])
    assert (c0.mask_rle, c0.kv_len, c0.kv_len_expected) == ([[1, 4]], 3, 3)


def test_batch_maps_hold_each_requests_segment() -> None:
    out = assemble(run(), maps=True)
    first, second, _ = out.maps
    a, b = first.segments
    assert (a.seq, a.start, a.length, a.request, a.drafts, a.chunk) == (0, 0, 3, "a", 0, False)
    assert (a.positions, a.writes, a.reads) == ((0, 1, 2), (8, 9, 10), (8, 9, 10))
    assert (b.seq, b.start, b.length, b.request, b.positions, b.writes, b.reads) == (
        1, 3, 2, "b", (0, 1), (20, 21), (20, 21),
    )  # fmt: skip
    (a,) = second.segments
    assert (a.start, a.length, a.drafts, a.positions, a.writes) == (0, 3, 2, (3, 4, 5), (11, 12, 13))
    assert a.reads == (8, 9, 10, 11, 12, 13)


def test_a_run_without_drafts_has_k_zero() -> None:
    records = copy.deepcopy(run()[:1])
    records[0]["draft_calls"] = []
    assert assemble(records).k == 0


def test_a_requests_budget_is_its_max_tokens_else_what_it_emitted() -> None:
    said = Request(0, "a", [5], 4, frozenset(), 0.0, [], output=[7, 8])
    unsaid = Request(1, "b", [5], None, frozenset(), 0.0, [], output=[7, 8])
    assert (said.budget, unsaid.budget) == (4, 2)


def test_a_third_draft_call_reads_the_drafts_before_it_as_its_own() -> None:
    """Three drafts (41 42 43): the third draft call attends the committed tokens and drafts 41 and
    42, written by the calls before it; all five of its slots hold a's own chain."""
    records = run()[:2]
    records[0]["draft_calls"].append(fed([42], [5], [0, 1], [6], [[2, 3]], [13]))
    records[1].update(
        spec={"draft_token_ids": [41, 42, 43], "num_draft_tokens": [3], "target_logits_indices": [0, 1, 2],
              "bonus_logits_indices": [3]},
        fed=fed([40, 41, 42, 43], [3, 4, 5, 6], [0, 4], [7], [[2, 3]], [11, 12, 13, 14]),
        argmax=[41, 50, 51, 52],
    )  # fmt: skip
    out = assemble(records)
    (a1,) = out.steps[1].rows
    assert out.k == 3 and (a1.draft_tokens, a1.accepted, a1.emitted) == ([41, 42, 43], 1, [41, 50])
    assert (a1.draft_position_ids, a1.draft_kv_lens, a1.draft_kv_len) == ([3, 4, 5], [3, 4, 5], 3)


def test_a_head_methods_draft_calls_are_not_judged_and_it_says_so() -> None:
    records = run()
    for r in records:
        r["engine"] = {**ENGINE, "method": "eagle", "draft_model": None}
    out = assemble(records)
    assert out.notes == ["eagle: its draft calls feed token p + 1 at position p; the draft-side checks do not apply"]
    assert out.steps[1].rows[0].draft_position_ids is None  # not read from the head's calls


def test_a_forward_the_capture_could_not_read_stops_reading_there() -> None:
    records = run()
    records[1]["fed"] = {"unreadable": "the forward had micro-batches or no attention metadata"}
    out = assemble(records)
    assert out.unreadable == {"step": 1, "why": "the forward had micro-batches or no attention metadata"}
    assert out.steps[0].step == 0 and 1 not in [s.step for s in out.steps]


def test_a_prefill_chunk_has_no_row_and_its_map_says_chunk() -> None:
    """Request c (prompt 5 6 7 9 10) is prefilled in two chunks: step 0 feeds 5 6 7 (its seq_len 3 is
    short of the prompt: no row, its sampled token dropped), step 1 feeds 9 10 and commits 60."""
    records = [
        record(0, [new("c", [5, 6, 7, 9, 10], 2)], ["c"], no_drafts(1),
               fed([5, 6, 7], [0, 1, 2], [0, 3], [3], [[2]], [8, 9, 10]), [44], [[44]]),
        record(1, [], ["c"], no_drafts(1), fed([9, 10], [3, 4], [0, 2], [5], [[2, 3]], [11, 12]), [60], [[60]]),
    ]  # fmt: skip
    out = assemble(records, maps=True)
    assert [s.step for s in out.steps] == [1] and out.requests[0].output == [60]
    (c1,) = out.steps[0].rows
    assert (c1.committed_before, c1.pending_token, c1.position_ids, c1.emitted) == (5, 10, [4], [60])
    assert (c1.mask_rle, c1.kv_len, c1.kv_len_expected) == ([[1, 5]], 4, 4)
    (chunk,) = out.maps[0].segments
    assert (chunk.chunk, chunk.drafts, chunk.length, chunk.reads) == (True, None, 3, (8, 9, 10))
    (last,) = out.maps[1].segments
    assert (last.chunk, last.drafts, last.start, last.length, last.writes) == (False, 0, 0, 2, (11, 12))


def test_an_unreadable_steps_map_says_why_and_the_next_draft_calls_are_not_judged() -> None:
    records = run()
    records[0]["fed"] = {"unreadable": "the forward had micro-batches or no attention metadata"}
    out = assemble(records, maps=True)
    first, second, _ = out.maps
    assert (first.readable, first.unreadable, first.segments) == (False, records[0]["fed"]["unreadable"], ())
    assert second.readable and [s.request for s in second.segments] == ["a"]
    (a1,) = out.steps[0].rows  # step 0 unread: its draft calls judge nothing at step 1
    assert (out.steps[0].step, a1.draft_tokens, a1.draft_position_ids, a1.draft_kv_len) == (1, [41, 42], None, None)


def test_each_unreadable_step_says_why() -> None:
    """What capture records of a step the watch cannot read (no target forward seen: capture's NO_FORWARD;
    embeddings fed; several KV cache groups; no sampler output): the first such step and its reason."""
    from specviz.watch.vllm.capture import NO_FORWARD

    cases = [
        (1, lambda r: r.update(fed=NO_FORWARD), "no target forward was seen in this runner step"),
        (2, lambda r: r["fed"].update(input_ids=None), "the forward was fed embeddings or no positions"),
        (0, lambda r: r.update(kv_groups=2), "2 KV cache groups (one block table per group): only one is read"),
        (1, lambda r: r.pop("sampled"), "the step's sampler output was not seen"),
    ]
    for step, spoil, why in cases:
        records = run()
        spoil(records[step])
        out = assemble(records)
        assert out.unreadable == {"step": step, "why": why}
        assert step not in [s.step for s in out.steps]


def test_an_overstated_seq_len_is_read_as_a_row_that_attends_past_its_tokens() -> None:
    # vLLM says request a holds 7 tokens at step 1 where it holds 6: the step's row reads one slot
    # more than its committed tokens (a kv-consistency violation for the checks), and no draft call of
    # step 0 can be judged against a committed length it does not have: none is, and nothing crashes.
    records = run()
    records[1]["fed"]["seq_lens"] = [7]
    a1 = assemble(records).steps[1].rows[0]
    assert (a1.kv_len, a1.kv_len_expected) == (3, 4)
    assert (a1.draft_kv_len, a1.draft_position_ids) == (None, None)
