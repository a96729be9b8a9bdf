"""An unreadable run's exact match speaks only for what was read: its outputs past the unread step
were never seen, so `check` (text and --json) and the app's summary never print a whole-run
exact match of 1.000 for it, however well the steps read agree with the reference. The oracle is
batch-1 greedy of the target (`shapes.reference`), each prompt to its own budget."""

from __future__ import annotations

import json

import torch
from test_batch_map import PROMPTS
from tiny import make_pair
from transformers import DynamicCache
from zoo import shapes

import specviz
from specviz.analysis.check import check_trace
from specviz.analysis.findings import UNREADABLE
from specviz.analysis.text import render_report
from specviz.cli import main
from specviz.trace.io import save_trace
from specviz.views.summary import stats_line, summary_markdown

BUDGETS = [4, 4]


def wrong_late(target, w, declared, wrong_from: int) -> list[list[int]]:
    """Each prompt decoded alone; from its `wrong_from`-th token on it emits the runner-up (wrong)."""
    outs = []
    for s, prompt in enumerate(PROMPTS):
        w.rows(declared(s))
        cache, ids, out = DynamicCache(), torch.tensor([prompt]), []
        while len(out) < BUDGETS[s]:
            logits = target(input_ids=ids, past_key_values=cache, use_cache=True).logits[0, -1]
            out.append(int(logits.topk(2).indices[1 if len(out) >= wrong_from else 0]))
            w.emit(s, out[-1:], "length" if len(out) == BUDGETS[s] else None)
            ids = torch.tensor([[out[-1]]])
        outs.append(out)
    return outs


def test_unreadable_run_with_a_wrong_output_prints_no_exact_match(tmp_path, capsys) -> None:
    """`w.rows` naming both sequences for a batch of one: unreadable from step 0, and the engine's
    output is wrong from its third token. Text, JSON and the app's line say the match is unknown."""
    pair = make_pair("llama")
    with specviz.watch(pair.target, prompts=PROMPTS) as w:
        outs = wrong_late(pair.target, w, lambda s: range(len(PROMPTS)), wrong_from=2)
    assert outs != shapes.reference(pair.target, PROMPTS, BUDGETS)  # the oracle: a wrong output
    report = check_trace(w.trace)
    assert report.verdict == "unreadable" and report.exact_match is None
    text = render_report(w.trace, report)
    assert "exact match: unknown (outputs unread from step 0)" in text and "1.000" not in text
    assert "exact match **unknown" in stats_line(w.trace, report)
    path = tmp_path / "wrong.trace.json"
    save_trace(w.trace, path)
    capsys.readouterr()
    assert main(["check", str(path), "--json"]) == 3
    payload = json.loads(capsys.readouterr().out)
    assert payload["verdict"] == "unreadable" and payload["exact_match"] is None
    assert payload["metrics"]["exact_match"] is None  # the metrics block says the same


def test_unreadable_from_a_later_step_reports_the_match_of_the_steps_read(tmp_path, capsys) -> None:
    """A run read up to step 2 (as the watch writes it: the steps before, the outputs they emitted,
    incomplete) whose engine went wrong after: the read part agrees with the reference and is
    said to agree over steps 0..1 only; the whole-run exact match is unknown, never 1.0."""
    pair = make_pair("llama")
    with specviz.watch(pair.target, prompts=PROMPTS) as w:
        outs = wrong_late(pair.target, w, lambda s: [s], wrong_from=2)
    full = check_trace(w.trace)
    assert full.verdict == "desync" and full.exact_match == 0.0  # read to the end: the bug is seen
    trace = w.trace
    trace.steps = trace.steps[:2]  # what a watch that stopped reading at step 2 keeps
    read = {s.seq_id: [] for s in trace.sequences}
    for step in trace.steps:
        for row in step.rows:
            read[row.write_seq] += row.emitted
    for seq in trace.sequences:
        seq.output_ids, seq.finish_reason = read[seq.seq_id], None
    trace.header.complete = False
    trace.header.options[UNREADABLE] = {"step": 2, "why": "target call 3: no producer"}
    assert all(o[: len(read[s])] == read[s] for s, o in enumerate(outs))
    report = check_trace(trace)
    assert report.verdict == "unreadable" and report.exact_match is None and report.exact_match_read == 1.0
    assert [s.verdict for s in report.sequences] == ["unread", "unread"]  # agree so far; never "exact"
    text = render_report(trace, report)
    assert "exact match: unknown (outputs unread from step 2); over the steps read (0..1): 2/2" in text
    assert "1.000" not in text.split("invariants:")[0]
    assert "[INCOMPLETE: read up to step 2]" in text and "interrupted" not in text  # it was not
    markdown = summary_markdown(trace, report)
    assert "over the steps read (0..1): 2/2" in markdown and "interrupted" not in markdown
    path = tmp_path / "partial.trace.json"
    save_trace(trace, path)
    capsys.readouterr()
    assert main(["check", str(path), "--json"]) == 3
    payload = json.loads(capsys.readouterr().out)
    assert payload["exact_match"] is None and payload["exact_match_read"] == 1.0
    assert {s["verdict"] for s in payload["sequences"]} == {"unread"}
