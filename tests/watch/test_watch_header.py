"""What a watched trace says beside its steps' tokens: `decode_seconds` (from the start of its
first captured call to its last event, measured around the engine from outside the watch), the
expected cache length each row records (as specviz's own recorder writes it: every committed
token but the pending one), and the header of a watch that saw nothing."""

from __future__ import annotations

import time

import torch
from tiny import make_pair
from transformers import DynamicCache

import specviz


@torch.no_grad()
def test_decode_seconds_span_the_first_call_to_the_last_emit() -> None:
    """A batch-1 greedy loop of 4 steps with a 50 ms pause after each (no CPU): the decode lasted
    at least from the end of the first forward to the last emit, about 0.2 s; reading only the
    last step would give about 0.05 s."""
    target = make_pair("llama").target
    prompt = [5, 6, 7]
    with specviz.watch(target, prompts=[prompt]) as w:
        w.rows([0])
        cache, ids, out = DynamicCache(), torch.tensor([prompt]), []
        first_done = None
        for n in range(4):
            logits = target(input_ids=ids, past_key_values=cache, use_cache=True).logits
            first_done = first_done or time.perf_counter()
            out.append(int(logits[0, -1].argmax()))
            time.sleep(0.05)
            last_emit = time.perf_counter()
            w.emit(0, out[-1:], "length" if n == 3 else None)
            ids = torch.tensor([[out[-1]]])
    seconds = w.trace.header.decode_seconds
    assert seconds is not None and seconds >= last_emit - first_done >= 0.15
    rows = [row for step in w.trace.steps for row in step.rows]
    assert [row.committed_before for row in rows] == [3, 4, 5, 6]
    assert [row.kv_len_expected for row in rows] == [2, 3, 4, 5] == [row.kv_len for row in rows]


def test_a_watch_that_saw_nothing_is_a_baseline_run_without_steps() -> None:
    target = make_pair("llama").target
    with specviz.watch(target, prompts=[[5, 6]]) as w:
        pass
    assert w.trace.steps == [] and w.trace.header.draft_k == 0 and w.trace.header.method == "baseline"


def test_emits_no_call_fed_are_no_steps_yet_an_eos_among_them_ends_the_sequence() -> None:
    """Tokens emitted before any forward (no call fed them): a note for each, no step; the output
    is what was emitted, and sequence 0, whose tokens hold the model's EOS (1), ended by "eos"."""
    target = make_pair("llama").target
    with specviz.watch(target, prompts=[[5, 6], [7, 8]]) as w:
        w.emit(0, [9, 1])
        w.emit(1, [9])
    trace = w.trace
    assert trace.steps == [] and len(trace.header.options["watch_notes"]) == 2
    assert [(s.output_ids, s.finish_reason) for s in trace.sequences] == [([9, 1], "eos"), ([9], None)]
