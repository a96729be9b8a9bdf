"""The batch map (`specviz/watch/batchmap.py`): packed calls cut by what they carry, "unreadable"
as a verdict (its exit status and JSON field), and a budget per sequence. The production-shaped
engines are `test_zoo_production.py`; these are the small cases each rule stands on."""

from __future__ import annotations

import json

import torch
from tiny import make_pair
from transformers import DynamicCache

import specviz
from specviz.analysis.check import check_trace
from specviz.analysis.findings import BUDGETS, UNREADABLE
from specviz.cli import main
from specviz.trace.io import save_trace
from specviz.watch.batchmap import read_map
from specviz.watch.hooks import CallRecord
from specviz.watch.tensor_reads import line_summary

PROMPTS = [[5, 6, 7, 8], [11, 12, 13]]


def packed_call(ids: list[int], positions: list[int], **fields) -> CallRecord:
    """A materialized 1 x T call, as the hooks leave it."""
    q = len(ids)
    call = CallRecord(
        role="target", rows=None, input_ids=[ids], positions=[positions], positions_fed=True, cache_width=0,
        mask_kind="none", mask=None, batch_size=1, query_len=q, packed=True,
    )  # fmt: skip
    for name, value in fields.items():
        setattr(call, name, value)
    return call


def segments(call: CallRecord) -> list[tuple[int, int]]:
    return [(s.start, s.length) for s in read_map(call).segments]


def test_a_packed_call_is_cut_by_what_it_carries() -> None:
    """cu_seq_lens_q first; else a block-diagonal mask (a token that drops the slots before it and
    restarts its position); else, with no mask and no cache, restarting positions (transformers'
    own rule). A sliding window (slots dropped, positions following) is one sequence."""
    ids = [5, 6, 7, 11, 12]
    assert segments(packed_call(ids, [0, 1, 2, 0, 1], cu_q=[0, 2, 5])) == [(0, 2), (2, 3)]
    assert segments(packed_call(ids, [0, 1, 2, 0, 1])) == [(0, 3), (3, 2)]
    block = [[j <= t for j in range(5)] for t in range(3)] + [
        [j in (3,) for j in range(5)],
        [j in (3, 4) for j in range(5)],
    ]
    lines = line_summary(torch.tensor(block))
    assert segments(packed_call(ids, [0, 1, 2, 0, 1], mask_kind="4d", lines=lines)) == [(0, 3), (3, 2)]
    window = [[t - 1 <= j <= t for j in range(5)] for t in range(5)]
    lines = line_summary(torch.tensor(window))
    assert segments(packed_call(ids, [0, 1, 2, 3, 4], mask_kind="4d", lines=lines)) == [(0, 5)]
    assert segments(packed_call(ids, [0, 1, 2, 3, 4], query_lens=[4, 1])) == [(0, 4), (4, 1)]
    assert (
        "rows declares 3 sequences" in read_map(packed_call(ids, [0, 1, 2, 3, 4], rows=(0, 1, 2))).unreadable
    )  # a value, not an exception


def test_a_packed_call_becomes_one_row_per_sequence() -> None:
    """`apply` on a varlen call (cu_seq_lens_q/k, no mask, logits of each sequence's last token):
    one right-padded row per sequence, its ids, positions and argmax in place, its context the
    keys of its own span before its first query token (a shared KV: 4 and 2 cached slots). With a
    mask, restarting positions alone cut nothing (the mask says who attends what)."""
    from specviz.watch.batchmap import apply

    call = packed_call(
        [9, 5, 6, 7], [4, 2, 3, 4], cu_q=[0, 1, 4], cu_k=[0, 5, 10], argmax=[[40, 41]], logit_slots=[0, 3]
    )
    assert apply(call, read_map(call)) and call.batch_size == 2 and call.query_len == 3
    assert call.input_ids == [[9, 0, 0], [5, 6, 7]] and call.positions == [[4, 0, 0], [2, 3, 4]]
    assert call.argmax == [[40, None, None], [None, None, 41]] and [v.cache for v in call.views] == [4, 2]
    assert [call.views[1].before(t) for t in range(3)] == [2, 3, 4]
    masked = packed_call([5, 6, 7, 11, 12], [0, 1, 2, 0, 1], mask_kind="2d", mask=[[1] * 5])
    assert segments(masked) == [(0, 5)]


@torch.no_grad()
def one_at_a_time(target, prompts, budgets, w, declared):
    """Each prompt decoded alone, batch 1, to its own budget; `declared` is what `w.rows` says."""
    outs = []
    for s, prompt in enumerate(prompts):
        w.rows(declared(s))
        cache, ids, out = DynamicCache(), torch.tensor([prompt]), []
        while len(out) < budgets[s]:
            logits = target(input_ids=ids, past_key_values=cache, use_cache=True).logits
            out.append(int(logits[0, -1].argmax()))
            w.emit(s, out[-1:], "length" if len(out) == budgets[s] else None)
            ids = torch.tensor([[out[-1]]])
        outs.append(out)
    return outs


def test_rows_that_name_more_sequences_than_a_row_holds_are_unreadable(tmp_path) -> None:
    """`w.rows` naming every sequence for a batch of one (the issue's silent case): unreadable from
    the first step, exit 3 and a JSON field from `check`; the same trace with a violation before
    that step is a desync (exit 1): what was read is still judged."""
    pair = make_pair("llama")
    with specviz.watch(pair.target, prompts=PROMPTS) as w:
        one_at_a_time(pair.target, PROMPTS, [3, 3], w, lambda s: range(len(PROMPTS)))
    report = check_trace(w.trace)
    assert report.verdict == "unreadable" and report.unreadable["step"] == 0
    assert "rows declares 2 sequences" in report.unreadable["why"] and not w.trace.header.complete
    path = tmp_path / "unread.trace.json"
    save_trace(w.trace, path)
    assert main(["check", str(path)]) == 3


def test_check_json_and_a_violation_before_the_unreadable_step(tmp_path, capsys) -> None:
    pair = make_pair("llama")
    with specviz.watch(pair.target, prompts=PROMPTS) as w:
        one_at_a_time(pair.target, PROMPTS, [3, 2], w, lambda s: [s])
    trace = w.trace
    assert check_trace(trace).verdict == "clean"
    trace.header.options[UNREADABLE] = {"step": 2, "why": "target call 9: no producer"}
    path = tmp_path / "t.trace.json"
    save_trace(trace, path)
    capsys.readouterr()
    assert main(["check", str(path), "--json"]) == 3
    payload = json.loads(capsys.readouterr().out)
    assert payload["verdict"] == "unreadable" and payload["unreadable"] == {
        "step": 2,
        "why": "target call 9: no producer",
    }
    trace.steps[1].rows[0].position_ids = [p + 1 for p in trace.steps[1].rows[0].position_ids]
    save_trace(trace, path)
    assert main(["check", str(path)]) == 1 and check_trace(trace).verdict == "desync"


def test_each_sequence_has_its_own_budget() -> None:
    """Budgets 4 and 2 (each ended by "length"): each reference decoded to its own budget, the
    budgets recorded, the run clean. The same run read against one budget (the largest, as before)
    would flag the short sequence's ending and its reference."""
    pair = make_pair("llama")
    with specviz.watch(pair.target, prompts=PROMPTS) as w:
        outs = one_at_a_time(pair.target, PROMPTS, [4, 2], w, lambda s: [s])
    trace = w.trace
    assert [len(s.reference_ids) for s in trace.sequences] == [4, 2]
    assert [s.output_ids for s in trace.sequences] == outs
    assert trace.header.options[BUDGETS] == {"1": 2} and trace.header.max_new_tokens == 4
    report = check_trace(trace)
    assert report.verdict == "clean" and not report.violation_count and report.exact_match == 1.0
    del trace.header.options[BUDGETS]
    assert check_trace(trace).violation_count  # one budget for all: the short one's ending is wrong


def test_a_packed_engine_is_drawn_one_sequence_per_grid_row() -> None:
    """The zoo's packed engine (one 1 x T row per forward): the app's grid of its first violation's
    step (a neighbour's slot attended) has one row per sequence of that step, as a padded one."""
    from zoo import packed

    from specviz.analysis.slots import step_slots
    from specviz.views.grid import grid_figure

    pair = make_pair("llama")
    prompts = [[5, 6, 7, 8], [11, 12, 13], [20, 21, 22]]
    with specviz.watch(pair.target, pair.draft, prompts=prompts) as w:
        packed.generate(pair.target, pair.draft, prompts, [6, 4, 5], bug="kv_leak", w=w)
    report = check_trace(w.trace)
    v = report.first_violation
    grid = step_slots(w.trace, v.step_index, report)
    held = [row.seq_id for row in w.trace.steps[v.step_index].rows]
    assert [row.seq_id for row in grid.rows] == held and len(set(held)) == len(held) > 1
    assert len(grid_figure(grid).data[0].z) == len(held)
