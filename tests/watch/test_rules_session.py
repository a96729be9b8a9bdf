"""The `Watch` itself (`specviz/watch/session.py`), on the tiny Llama pair: what the header says
proposed the drafts, what `batch` accepts and refuses, that `close` takes its hooks off the user's
models, when undeclared rows are followed (a batch that shrinks at its second and last call), the
messages of a wrong `model=`, layout, draft or sequence, a watch closed before any call, `trace`
before and after close, tokens emitted as a tensor, and the prompts read without `prompts=`."""

from __future__ import annotations

import functools

import pytest
import torch
from tiny import make_pair
from transformers import DynamicCache
from zoo import compact, head

import specviz
from specviz.analysis.check import check_trace
from specviz.watch import WatchError

PROMPTS = [[5, 6, 7, 8], [11, 12, 13]]


@functools.cache
def pair():
    return make_pair("llama")


def _hooks_on(model: torch.nn.Module) -> int:
    """Forward hooks and pre-hooks on every module of `model`."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_a_run_drafted_by_a_named_head_says_the_head_proposed() -> None:
    """With `drafter=` the drafts came from the head: the header's proposer is "head"; a draft
    model's run says "draft-model"."""
    p = pair()
    heads = head.DraftHead(p.target)
    with specviz.watch(p.target, prompts=PROMPTS, drafter=heads) as w:
        head.generate(p.target, heads, PROMPTS, 4, w=w)
    assert w.trace.header.draft_k > 0 and w.trace.header.proposer == "head"
    with specviz.watch(p.target, p.draft, prompts=PROMPTS) as w:
        compact.generate(p.target, p.draft, PROMPTS, 4, w=w)
    assert w.trace.header.draft_k > 0 and w.trace.header.proposer == "draft-model"


def test_batch_declares_the_next_forwards_trees_and_refuses_a_wrong_count() -> None:
    p = pair()
    w = specviz.watch(p.target, prompts=PROMPTS)
    try:
        w.batch([0, 1], parents=[[-1, 0, 0], None])  # a tree of three nodes, and a prefill riding along
        said = w.declared("target")
        assert said.rows == (0, 1) and said.parents == [[-1, 0, 0], None]
        assert w.declared("target").parents is None  # it was for one forward only
        w.batch([1])  # no trees: none declared
        assert w.declared("target").parents is None
        with pytest.raises(WatchError, match="2 sequences need 2 trees in parents=, got 1"):
            w.batch([0, 1], parents=[[-1]])
        with pytest.raises(WatchError, match="declares the target's trees"):
            w.batch([0], parents=[[-1]], model="draft")
    finally:
        w.close(reference=False, complete=False)


def test_close_takes_every_hook_off_the_models() -> None:
    p = pair()
    before = (_hooks_on(p.target), _hooks_on(p.draft))
    w = specviz.watch(p.target, p.draft, prompts=PROMPTS)
    assert _hooks_on(p.target) > before[0] and _hooks_on(p.draft) > before[1]
    compact.generate(p.target, p.draft, PROMPTS, 3, w=w)
    w.close(reference=False)
    assert (_hooks_on(p.target), _hooks_on(p.draft)) == before


def test_rows_are_followed_when_only_the_second_and_last_call_shrinks_the_batch() -> None:
    """Nothing declares the rows. Sequence 0 ends at the prefill (a budget of one token), so the
    second target call, the run's last, holds sequence 1 alone in row 0: row r does not hold
    sequence r there, so the rows are followed and that row is read as sequence 1."""
    p = pair()
    prompts = [[5, 6, 7], [11, 12, 13]]  # one length: no padding
    with torch.no_grad(), specviz.watch(p.target, prompts=prompts) as w:
        cache = DynamicCache()
        first = p.target(input_ids=torch.tensor(prompts), past_key_values=cache).logits[:, -1].argmax(-1).tolist()
        w.emit(0, [first[0]], "length")
        w.emit(1, [first[1]])
        cache.batch_select_indices(torch.tensor([1]))
        second = int(p.target(input_ids=torch.tensor([[first[1]]]), past_key_values=cache).logits[0, -1].argmax())
        w.emit(1, [second], "length")
    trace = w.trace
    assert [[r.seq_id for r in s.rows] for s in trace.steps] == [[0, 1], [1]]
    assert [s.output_ids for s in trace.sequences] == [[first[0]], [first[1], second]]
    report = check_trace(trace)
    assert report.verdict == "clean" and report.exact_match == 1.0, [v.message for v in report.violations[:3]]


def test_a_wrong_model_name_is_refused_naming_every_choice() -> None:
    p = pair()
    w = specviz.watch(p.target, prompts=PROMPTS)
    try:
        with pytest.raises(WatchError, match=r"rows: model must be None, 'target' or 'draft', got 'both'"):
            w.rows([0, 1], model="both")
        with pytest.raises(WatchError, match=r"batch: model must be 'target' or 'draft', got None"):
            w.batch([0, 1], model=None)
    finally:
        w.close(reference=False, complete=False)


def test_a_watch_closed_before_any_call_writes_an_empty_trace() -> None:
    """No prompts and no target call: no sequence to read, an empty trace (not a crash)."""
    p = pair()
    trace = specviz.watch(p.target).close()
    assert trace.steps == [] and trace.sequences == []


def test_a_layout_not_known_or_the_target_as_its_own_draft_is_refused() -> None:
    p = pair()
    with pytest.raises(WatchError, match="layout must be one of .*, got 'sideways'"):
        specviz.watch(p.target, prompts=PROMPTS, layout="sideways")
    with pytest.raises(WatchError, match="draft and target are the same module"):
        specviz.watch(p.target, p.target, prompts=PROMPTS)


def test_an_unknown_sequence_is_refused_naming_the_prompts_range() -> None:
    p = pair()
    w = specviz.watch(p.target, prompts=PROMPTS)
    try:
        with pytest.raises(WatchError, match=r"emit: unknown sequence 2; prompts are sequences 0\.\.1$"):
            w.emit(2, [1])
    finally:
        w.close(reference=False, complete=False)


def test_the_trace_is_none_until_close_and_tokens_may_come_as_a_tensor() -> None:
    """`w.trace` is the trace once closed (None before); `emit` takes a tensor of any shape."""
    p = pair()
    w = specviz.watch(p.target, prompts=[[5, 6, 7]])
    assert w.trace is None
    with torch.no_grad():
        token = p.target(input_ids=torch.tensor([[5, 6, 7]])).logits[:, -1:].argmax(-1)  # [[t]]
    w.emit(0, token, "length")
    trace = w.close()
    assert w.trace is trace and trace.sequences[0].output_ids == [int(token)]


def test_without_prompts_the_first_target_calls_rows_are_the_prompts() -> None:
    """No prompts given: each row of the first target call is a prompt, not the rows of a draft
    call made before it."""
    p = pair()
    w = specviz.watch(p.target, p.draft)
    with torch.no_grad():
        p.draft(input_ids=torch.tensor([[9, 9]]))
        token = int(p.target(input_ids=torch.tensor([[5, 6, 7]])).logits[0, -1].argmax())
    w.emit(0, [token], "length")
    trace = w.close(reference=False)
    assert [s.prompt_ids for s in trace.sequences] == [[5, 6, 7]]


def test_prompts_given_once_as_a_generator_or_an_array_keep_their_ids_and_texts() -> None:
    """Prompts are read once: text prompts from a generator keep their texts (the trace's prompt),
    and the rows of a numpy array are prompts (no truth value asked of the array)."""
    import numpy
    from zoo.scripts.run_engine import tiny_tokenizer  # word-level: "w7" is id 7

    p = pair()
    w = specviz.watch(p.target, prompts=(text for text in ["w7", "w6"]), tokenizer=tiny_tokenizer())
    assert w.prompts == [[7], [6]] and w.prompt_texts == {0: "w7", 1: "w6"}
    w.close(reference=False, complete=False)
    w = specviz.watch(p.target, prompts=numpy.array(PROMPTS[:1] * 2))
    assert w.prompts == [PROMPTS[0], PROMPTS[0]] and w.prompt_texts == {}
    w.close(reference=False, complete=False)


def test_without_prompts_any_sequence_id_at_least_0_is_one_and_a_negative_one_is_refused() -> None:
    p = pair()
    w = specviz.watch(p.target)
    try:
        w.rows([0, 7])  # no prompts: any index >= 0 names a sequence
        with pytest.raises(WatchError, match=r"rows: sequence ids are prompt indices \(0, 1, \.\.\.\), got -1$"):
            w.rows([0, -1])
    finally:
        w.close(reference=False, complete=False)
