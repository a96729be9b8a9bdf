"""An engine that forgets `attention_mask` under left padding: the command and the API agree.

A batched greedy loop over the tiny Llama feeds correct `position_ids` but no mask, so each padded
row attends its pad slots. `specviz.watch(...)` is told the prompts; `specviz watch -- python
script.py` reads them off the first call, where, with no mask, the pads look like tokens. Both must
name the same first violation (step, row, invariant) and its cause; with the mask passed both are
clean. The oracle is the loop itself: the padded rows are the rows shorter than the longest prompt.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import watch_engine
from tiny import make_pair

import specviz
from specviz.analysis.check import check_trace
from specviz.cli import main
from specviz.trace.invariants import Invariant
from specviz.trace.io import load_trace

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20]]
STEPS = 5
CAUSE = "attends its padding"
HINT = "is `attention_mask` passed?"


@torch.no_grad()
def greedy(model: torch.nn.Module, with_mask: bool, w: specviz.Watch | None = None) -> None:
    """Left-padded batched greedy; positions always right, the mask passed only `with_mask`."""
    width = max(len(p) for p in PROMPTS)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    cache = None
    for step in range(STEPS):
        kwargs = {"position_ids": (mask.cumsum(1) - 1)[:, -ids.shape[1] :].clamp(min=0)}
        if cache is not None:
            kwargs["past_key_values"] = cache
        if with_mask:
            kwargs["attention_mask"] = mask
        out = model(input_ids=ids, use_cache=True, **kwargs)
        cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1)
        for r in range(len(PROMPTS)) if w is not None else ():
            w.emit(r, [int(nxt[r])], "length" if step == STEPS - 1 else None)
        ids, mask = nxt[:, None], torch.cat([mask, torch.ones(len(PROMPTS), 1, dtype=mask.dtype)], 1)


SCRIPT = """
import sys
from tiny import make_pair
from test_mask_diagnosis import greedy

greedy(make_pair("llama").target, "--mask" in sys.argv)
"""


def by_api(with_mask: bool):
    pair = make_pair("llama")
    w = specviz.watch(pair.target, prompts=PROMPTS)
    greedy(pair.target, with_mask, w)
    return check_trace(w.close())


def by_command(tmp_path: Path, with_mask: bool):
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    out = tmp_path / "loop.trace.json"
    assert main(["watch", "--out", str(out), "--", "python", str(script)] + (["--mask"] if with_mask else [])) == 0
    trace = load_trace(out)
    assert [s.prompt_ids for s in trace.sequences] == PROMPTS  # the pads are not read as prompt tokens
    return check_trace(trace)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_missing_mask_gets_one_diagnosis_from_the_command_and_the_api(tmp_path: Path) -> None:
    width = max(len(p) for p in PROMPTS)
    padded = {r for r, p in enumerate(PROMPTS) if len(p) < width}
    firsts = []
    for report in (by_api(False), by_command(tmp_path, False)):
        assert report.verdict == "desync"
        v = report.first_violation
        firsts.append((v.step, v.row, v.invariant))
        assert v.invariant == Invariant.KV and v.row == min(padded)
        assert f"row {v.row} {CAUSE}" in v.message and HINT in v.message, v.message
        at_step0 = {x.row for x in report.violations if x.step == 0 and HINT in x.message}
        assert at_step0 == padded  # every padded row is named, the unpadded one never
    assert firsts[0] == firsts[1] == (0, min(padded), Invariant.KV)


SPEC_PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21]]


def forward_without_mask(model, ids, mask, cache, positions):
    """watch_engine.forward, less the mask: positions right, every slot attended."""
    kwargs = {watch_engine.cache_kw(model): cache} if cache is not None else {}
    return model(input_ids=ids, use_cache=True, position_ids=positions, **kwargs)


SPEC_SCRIPT = """
import watch_engine
from tiny import make_pair
from test_mask_diagnosis import SPEC_PROMPTS, forward_without_mask

pair, kept = make_pair("llama"), watch_engine.forward
watch_engine.forward = forward_without_mask
try:
    watch_engine.generate(pair.target, pair.draft, SPEC_PROMPTS, 3, 6, frozenset([1]), 0)
finally:
    watch_engine.forward = kept
"""


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_speculative_engine_without_its_mask_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/support/watch_engine.py (draft and target), its mask dropped: the same agreement."""
    script = tmp_path / "spec.py"
    script.write_text(SPEC_SCRIPT)
    out = tmp_path / "spec.trace.json"
    assert main(["watch", "--out", str(out), "--", "python", str(script)]) == 0
    by_cmd = check_trace(load_trace(out))
    pair = make_pair("llama")
    w = specviz.watch(pair.target, pair.draft, prompts=SPEC_PROMPTS)
    monkeypatch.setattr(watch_engine, "forward", forward_without_mask)
    watch_engine.generate(pair.target, pair.draft, SPEC_PROMPTS, 3, 6, frozenset([1]), 0, watch=w)
    by_api = check_trace(w.close())
    firsts = {(r.first_violation.step, r.first_violation.row, r.first_violation.invariant) for r in (by_cmd, by_api)}
    assert firsts == {(0, 1, Invariant.KV)}  # row 0 holds the longest prompt: nothing to pad
    assert all(HINT in r.first_violation.message for r in (by_cmd, by_api))


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_the_same_loop_with_its_mask_is_clean_both_ways(tmp_path: Path) -> None:
    for report in (by_api(True), by_command(tmp_path, True)):
        assert report.verdict == "clean" and report.exact_match == 1.0, report.violations[:3]


def test_an_engine_that_passes_its_mask_never_gets_the_hint() -> None:
    """pad-accumulation (bundled trace) re-packs old padding as attended content: at step 23 every row
    attends all its slots and more than its context, as a mask-less batch does, but its earlier steps
    masked padding, so the engine passes a mask and the hint would name a false cause."""
    trace = load_trace(Path(__file__).parents[2] / "traces" / "default-eqspec-pad-accumulation.json.gz")
    report = check_trace(trace)
    excess = [
        v
        for v in report.violations
        if v.field == "kv_len" and v.actual > v.expected and trace.steps[v.step_index].rows[v.row].mask_rle[0][0] == 1
    ]
    assert excess, "the trace no longer holds an unmasked row attending more than its context"
    assert not [v for v in report.violations if HINT in v.message]
