"""A DESYNC verdict beside "exact match 1.000" says why it matters: a loop that forgot position_ids
(rotary embeddings hid it) is a bug the outputs do not show yet; a drafter fed a wrong state costs
acceptance only. Said by `check`, by `record`'s summary and by the app's summary."""

from __future__ import annotations

from pathlib import Path

import pytest
from drafting import MANY, decode, with_oracle

from specviz.analysis.check import check_trace
from specviz.analysis.notes import exact_desync_note
from specviz.analysis.text import render_report
from specviz.cli import main
from specviz.trace.io import load_trace
from specviz.views.summary import summary_markdown

# A batched greedy loop over a tiny random Llama, left-padded, that passes no position_ids: the
# model then numbers each padded row's tokens from its first pad, and rotary embeddings, which
# see only distances, keep the outputs exact.
FORGETS_POSITIONS = """
import torch
import transformers as tf

torch.manual_seed(0)
config = tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                        bos_token_id=2, eos_token_id=1, pad_token_id=0)
model = tf.AutoModelForCausalLM.from_config(config).eval()
prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20]]
width = max(len(p) for p in prompts)
ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
cache = None
with torch.no_grad():
    for _ in range(6):
        kwargs = {"past_key_values": cache} if cache is not None else {}
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, **kwargs)
        cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1)
        ids, mask = nxt[:, None], torch.cat([mask, torch.ones(len(prompts), 1, dtype=mask.dtype)], 1)
"""


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_loop_that_forgot_position_ids_is_a_bug_the_outputs_hide(tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(FORGETS_POSITIONS)
    out = tmp_path / "loop.trace.json"
    assert main(["watch", "--out", str(out), "--", "python", str(script)]) == 0
    trace = load_trace(out)
    report = check_trace(trace)
    assert report.verdict == "desync" and report.exact_match == 1.0  # the case: outputs agree
    note = exact_desync_note(report)
    assert "rotary" in note and "diverge" in note
    assert note in render_report(trace, report)  # `specviz check`
    assert "rotary position embeddings" in summary_markdown(trace, report)  # the app


def test_a_drafter_fed_a_wrong_state_costs_acceptance_not_correctness() -> None:
    prompts = MANY[:6]
    trace = with_oracle(decode("eqspec", "draft-model", 4, prompts=prompts, fault="draft-positions"), prompts)
    report = check_trace(trace)
    assert report.verdict == "desync" and report.exact_match == 1.0
    note = exact_desync_note(report)
    assert "acceptance" in note and "not correctness" in note and "diverge" not in note


def test_exact_clean_and_inexact_desync_runs_need_no_note() -> None:
    prompts = MANY[:6]
    clean = with_oracle(decode("eqspec", "draft-model", 4, prompts=prompts), prompts)
    assert check_trace(clean).verdict == "clean" and exact_desync_note(check_trace(clean)) is None
    broken = with_oracle(decode("eqspec", "draft-model", 4, prompts=prompts, fault="extra-accept"), prompts)
    report = check_trace(broken)
    assert report.verdict == "desync" and report.exact_match < 1.0 and exact_desync_note(report) is None
