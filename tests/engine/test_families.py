"""More model families, and sliding-window models past their window, exact against batch-1 greedy.

Families differ in attention details the ragged engine must not disturb: biases (Qwen2), query and
key norms (Qwen3, OLMo2), logit soft-capping and mixed sliding/full layers (Gemma 2),
mixture-of-experts layers (Mixtral, Qwen2-MoE). Sliding-window models are built with a window of 8
tokens and decoded with prompts of up to 90, so every row runs far past its window with left
padding and ragged lengths; the engine masks each row's window in its own logical tokens
(`specviz/engine/kv/window.py`), and the oracle is the model's own batch-1 decoding with its own
sliding cache. Tiny configs and few prompts keep this file to seconds.
"""

from __future__ import annotations

import functools

import pytest
import torch
from exactness import PROMPTS
from tiny import MORE_FAMILIES, WINDOW_FAMILIES, make_pair

from specviz.engine.kv.window import WindowSpec, window_spec
from specviz.engine.reference import greedy_reference
from specviz.engine.run import RunConfig, run
from specviz.errors import SpecvizError

# 1 to 90 tokens: short rows next to rows many windows long.
FAMILY_PROMPTS = [PROMPTS[i] for i in (4, 0, 9, 3, 13, 7)]
MAX_NEW = 10
WINDOW = 8


@functools.cache
def pair_for(family: str, window: int | None = None):
    return make_pair(family, window=window)


@functools.cache
def oracle(family: str, window: int | None = None) -> tuple:
    pair = pair_for(family, window)
    return tuple(
        tuple(greedy_reference(pair.target, pair.tokenizer(p)["input_ids"], MAX_NEW, frozenset([1]), pair.device)[0])
        for p in FAMILY_PROMPTS
    )


def assert_exact(family: str, method: str, window: int | None = None) -> None:
    cfg = RunConfig(method=method, batch_size=4, draft_k=3, max_new_tokens=MAX_NEW, reference=False)
    trace = run(pair_for(family, window), FAMILY_PROMPTS, cfg)
    expected = oracle(family, window)
    for seq in trace.sequences:
        assert tuple(seq.output_ids) == expected[seq.seq_id], f"{family}: sequence {seq.seq_id} diverged"


# inplace refuses models with sliding-window layers (Gemma 2's mixed layers), so that pair is not
# run: the refusal has its own test below (issue 26: a parametrization that skipped everywhere).
NO_INPLACE = {("gemma2", "inplace")}


@pytest.mark.parametrize(
    "family,method",
    [(f, m) for f in MORE_FAMILIES for m in ("eqspec", "exspec", "inplace") if (f, m) not in NO_INPLACE],
)
def test_more_families_exact(family: str, method: str) -> None:
    assert_exact(family, method)


def test_families_without_inplace_are_the_windowed_ones() -> None:
    """The pairs left out above are exactly the families inplace would refuse."""
    windowed = {f for f in MORE_FAMILIES if window_spec(pair_for(f, None).target).windowed}
    assert {(f, "inplace") for f in windowed} == NO_INPLACE


@pytest.mark.parametrize("method", ["eqspec", "exspec"])
@pytest.mark.parametrize("family", WINDOW_FAMILIES)
def test_sliding_window_exact_past_the_window(family: str, method: str) -> None:
    spec = window_spec(pair_for(family, WINDOW).target)
    assert spec.window == WINDOW and spec.problem() is None
    assert max(len(p) for p in FAMILY_PROMPTS) > 10 * WINDOW
    assert_exact(family, method, WINDOW)


def test_window_masks_matter() -> None:
    """The windowed oracle differs from full attention here, so exactness above is not vacuous."""
    pair = pair_for("mistral", WINDOW)
    ids = pair.tokenizer(FAMILY_PROMPTS[0])["input_ids"]
    with torch.no_grad():
        windowed = pair.target(torch.tensor([ids])).logits[0, -1]
        pair.target.config.sliding_window = None
        try:
            full = pair.target(torch.tensor([ids])).logits[0, -1]
        finally:
            pair.target.config.sliding_window = WINDOW
    assert not torch.allclose(windowed, full, atol=1e-4)


def test_unmaskable_window_refused_before_any_compute() -> None:
    pair = make_pair("mistral", window=WINDOW)
    spec = window_spec(pair.target)
    pair.target._specviz_window_spec = WindowSpec(spec.window, spec.layer_kinds, False, "flash_attention_2")
    _refused_past_the_window_only(pair, "eqspec", "sliding window of 8 tokens")


def test_inplace_refuses_a_window_it_would_pass_before_any_compute() -> None:
    """`inplace` feeds one 4-D mask to every layer: past a sliding window it would be inexact."""
    pair = make_pair("mistral", window=WINDOW)
    _refused_past_the_window_only(pair, "inplace", "--method inplace does not mask sliding windows")


def _refused_past_the_window_only(pair, method: str, message: str) -> None:
    """A prompt past the window is refused in one line before any forward; within it, exact."""
    calls = []
    pair.target.register_forward_hook(lambda *args: calls.append(1))
    pair.draft.register_forward_hook(lambda *args: calls.append(1))
    cfg = RunConfig(method=method, batch_size=2, draft_k=2, max_new_tokens=4)
    with pytest.raises(SpecvizError, match=message) as err:
        run(pair, ["ab", "m" * 20], cfg)
    assert "\n" not in str(err.value) and calls == []
    short = run(pair, ["ab", "cd"], RunConfig(method=method, batch_size=2, draft_k=2, max_new_tokens=3))
    assert all(seq.output_ids == seq.reference_ids for seq in short.sequences), "within the window it runs"
