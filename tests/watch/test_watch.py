"""specviz.watch: hooks on HF models trace engines that are not ours, judged by the same checks.

1. specviz's own engine, recorder off, under watch: same verdict and first (step, row, invariant)
   as the recorder's trace, clean and for every fault.
2. An independent engine (tests/support/watch_engine.py): clean -> clean; injected bugs found where injected;
   no bonus and a cacheless draft are not violations.
3. A hand-written greedy loop without position_ids is desync on its left-padded rows from step 0;
   with them it is clean and exact; HF generate watched is clean.
Plus bad use, crashes, and version-1 files.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
import transformers
from catalogue import ORIGINAL_FAULTS
from own_watched import run_watched_engine
from watch_engine import Bugs, generate

import specviz
from specviz.analysis.check import check_trace
from specviz.analysis.metrics import tokens_left_on_table
from specviz.engine.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specviz.engine.reference import greedy_reference
from specviz.trace.io import load_trace, parse_trace_bytes, trace_to_dict
from specviz.watch import WatchError

NEW_ENGINE = int(transformers.__version__.split(".")[0]) >= 5  # specviz's own engine needs 5.x
K, MAX_NEW = 4, 16
TEXTS = [
    "What is the capital of France? Answer in one word.",
    "Write a haiku about the sea",
    "Explain",
    "List three prime numbers and explain why each of them is prime, in detail please.",
    "Tell me a story about a dragon who learned to read books.",
    "Why is the sky blue?",
]


@functools.cache
def models():
    """The embedded pair, loaded the plain HF way (works on transformers 4.45+ and 5.x)."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    # From tokenizer.json directly: the saved tokenizer_config names a 5.x-only class.
    config = json.loads((Path(DEFAULT_TARGET) / "tokenizer_config.json").read_text())
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(Path(DEFAULT_TARGET) / "tokenizer.json"),
        eos_token=config["eos_token"],
        pad_token=config["pad_token"],
    )
    target = AutoModelForCausalLM.from_pretrained(DEFAULT_TARGET).float().eval()
    draft = AutoModelForCausalLM.from_pretrained(DEFAULT_DRAFT).float().eval()
    return target, draft, tok


@functools.cache
def prompt_ids() -> tuple[tuple[int, ...], ...]:
    tok = models()[2]
    return tuple(tuple(tok(t)["input_ids"]) for t in TEXTS)


def eos_and_pad() -> tuple[frozenset[int], int]:
    tok = models()[2]
    eos = frozenset([tok.eos_token_id]) if tok.eos_token_id is not None else frozenset()
    pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos), 0)
    return eos, pad


def first(report) -> tuple[int, int, int] | None:
    v = report.first_violation
    return (v.step, v.row, v.invariant) if v else None


# ----------------------------------------------------------------------------- 1. our engine

FAULT_CASES = [("eqspec", None), ("exspec", None)] + [
    ("exspec" if f == "row-mixup" else "eqspec", f) for f in ORIGINAL_FAULTS
]
# INPLACE writes each row's query at its own slots of a fixed-width cache: its 4-D mask's keys are
# those slots, not [cache | query], so the watch reads it by counts (`calls._mask4_slots_row`).
FAULT_CASES += [("inplace", None)]  # faults model the left-padded layout: not on INPLACE


@functools.cache
def specviz_pair():
    from specviz.engine.models import load_pair

    return load_pair(device="cpu")


@functools.cache
def shared_references() -> tuple[tuple[tuple[int, ...], tuple[float, ...]], ...]:
    pair = specviz_pair()
    eos = frozenset(pair.eos_token_ids)
    ids = [list(pair.tokenizer(t)["input_ids"]) for t in TEXTS]
    return tuple(tuple(map(tuple, greedy_reference(pair.target, p, MAX_NEW, eos))) for p in ids)


def _with_references(trace):
    for seq, (ids, margins) in zip(trace.sequences, shared_references()):
        seq.reference_ids, seq.reference_margins = list(ids), list(margins)
    return trace


def _config(method: str, fault: str | None, record: bool):
    from specviz.engine.run import RunConfig

    config = RunConfig(method=method, fault=fault, batch_size=4, draft_k=K, max_new_tokens=MAX_NEW)
    config.reference, config.record_steps = False, record
    return config


def run_watched(method: str, fault: str | None, reference: bool, texts: list[str] = TEXTS):
    """Our engine with its recorder off; two lines of instrumentation in a subclass of its Engine."""
    pair = specviz_pair()
    layout = "unspecified" if method == "inplace" else "left-padded"  # INPLACE keeps no left padding
    w = specviz.watch(pair.target, pair.draft, tokenizer=pair.tokenizer, prompts=texts, layout=layout)
    run_watched_engine(pair, texts, _config(method, fault, record=False), w)
    return w.close(reference=reference)


@pytest.mark.skipif(not NEW_ENGINE, reason="specviz's own engine needs transformers 5")
@pytest.mark.parametrize("method,fault", FAULT_CASES, ids=[f or f"clean-{m}" for m, f in FAULT_CASES])
def test_own_engine_watched_matches_recorder(method: str, fault: str | None) -> None:
    from specviz.engine.run import run

    recorded = _with_references(run(specviz_pair(), TEXTS, _config(method, fault, record=True)))
    clean = fault is None
    watched = run_watched(method, fault, reference=clean)  # the clean runs use watch's own reference
    if not clean:
        _with_references(watched)
    expected, got = check_trace(recorded), check_trace(watched)
    assert (got.verdict, first(got)) == (expected.verdict, first(expected))
    assert watched.header.draft_k == K and len(watched.steps) == len(recorded.steps)
    if clean:
        assert got.verdict == "clean" and got.exact_match == 1.0 and got.violation_count == 0
        return
    # Both seeing nothing would also agree: the fault must be found where it fired (issue 26).
    events = recorded.header.fault_events
    assert events, f"{fault} never fired with these prompts"
    assert got.verdict == "desync"
    v = got.first_violation
    assert (v.step, v.row, v.seq_id) == (events[0]["step"], events[0]["row"], events[0]["seq_id"])
    at_first = {x.invariant for x in got.violations if (x.step, x.row) == (v.step, v.row)}
    from specviz.engine.faults import FAULTS  # transformers 5 only, like the engine

    assert at_first & set(FAULTS[fault].invariants), f"{fault}: broke {at_first}"


REPEATING = ["The ragged tensor problem is", "Hello", "A"]  # "A": one token, then one token repeated


@pytest.mark.skipif(not NEW_ENGINE, reason="specviz's own engine needs transformers 5")
def test_own_engine_with_a_repeating_draft_is_read_from_the_right_calls() -> None:
    """A draft that proposes one token over and over makes several runs of draft calls fit the
    verified tokens: after a step that accepts every draft, EQSPEC first re-feeds the last draft to
    the draft model (a catch-up call), then proposes. The watch once took the catch-up call as the
    first proposal and flagged a correct engine (draft positions one behind, on every later step)."""
    from specviz.engine.run import run

    recorded = run(specviz_pair(), REPEATING, _config("eqspec", None, record=True))
    rows = [r for s in recorded.steps for r in s.rows]
    ambiguous = [r for r in rows if r.accepted == K and len(set(r.draft_tokens)) == 1]
    assert ambiguous, "no row accepted a run of one repeated draft token: the hazard is not exercised"
    watched = run_watched("eqspec", None, reference=True, texts=REPEATING)
    report = check_trace(watched)
    assert (report.verdict, report.violation_count, report.exact_match) == ("clean", 0, 1.0)
    by_seq = {(s.step, r.seq_id): r.draft_position_ids for s in recorded.steps for r in s.rows}
    got = {(s.step, r.seq_id): r.draft_position_ids for s in watched.steps for r in s.rows}
    assert got == by_seq


# ----------------------------------------------------------------------------- 2. independent engine


def run_independent(bugs: Bugs, out=None):
    target, draft, tok = models()
    eos, pad = eos_and_pad()
    prompts = [list(p) for p in prompt_ids()]
    with specviz.watch(target, draft, tokenizer=tok, prompts=prompts, out=out, name="watch_engine") as w:
        rows = generate(target, draft, prompts, K, MAX_NEW, eos, pad, bugs, watch=w)
    return rows, w.trace


def test_independent_engine_clean(tmp_path) -> None:
    rows, trace = run_independent(Bugs(), out=tmp_path / "clean.trace.json")
    report = check_trace(load_trace(tmp_path / "clean.trace.json"))
    assert report.verdict == "clean" and report.exact_match == 1.0, report.violations[:3]
    assert trace.header.engine == "watch_engine" and trace.header.layout == "unspecified"
    assert [s.output_ids for s in trace.sequences] == rows.outputs
    # Its draft cache holds every committed token but the pending one, as read from the draft's mask.
    drafted = [r for s in trace.steps for r in s.rows if r.draft_kv_len is not None]
    assert drafted and all(r.draft_kv_len == r.draft_kv_len_expected == r.committed_before - 1 for r in drafted)
    assert tokens_left_on_table(trace) == 0


SLOWER = [Bugs(no_bonus=True), Bugs(draft_without_cache=True)]


@pytest.mark.parametrize("bugs", SLOWER, ids=["no-bonus", "no-draft-cache"])
def test_slower_engines_are_not_desync(bugs: Bugs) -> None:
    _, trace = run_independent(bugs)
    report = check_trace(trace)
    assert report.verdict == "clean" and report.exact_match == 1.0, report.violations[:3]
    if bugs.no_bonus:
        assert tokens_left_on_table(trace) > 0
    else:
        assert all(r.draft_kv_lens is not None for s in trace.steps for r in s.rows)


INJECTED = {
    "no-position-ids": (Bugs(no_position_ids=True), 2),
    "keep-rejected-kv": (Bugs(keep_rejected_kv=True), 3),
    "accept-one-more": (Bugs(accept_one_more=True), 4),
    "row-mixup": (Bugs(mixup_at_step=2), 4),
}


@pytest.mark.parametrize("name", sorted(INJECTED))
def test_independent_engine_bug_found_where_injected(name: str) -> None:
    bugs, invariant = INJECTED[name]
    rows, trace = run_independent(bugs)
    assert rows.events, f"{name} never fired"
    report = check_trace(trace)
    assert report.verdict == "desync"
    v = report.first_violation
    assert (v.step, v.row) == rows.events[0]
    assert invariant in {x.invariant for x in report.violations if (x.step, x.row) == (v.step, v.row)}


# ----------------------------------------------------------------------------- 3. plain greedy loops


@torch.no_grad()
def greedy_loop(model, prompts, pad, eos, max_new, w, positions: bool) -> None:
    """Batched greedy with left padding, the way many scripts write it."""
    from watch_engine import cache_kw, out_cache

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    cache, live = None, list(range(len(prompts)))
    counts = [0] * len(prompts)
    for _ in range(max_new):
        kwargs = {"position_ids": (mask.cumsum(1) - 1).clamp(min=0)[:, -ids.shape[1] :]} if positions else {}
        if cache is not None:
            kwargs[cache_kw(model)] = cache
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, **kwargs)
        cache, nxt = out_cache(out), out.logits[:, -1].argmax(-1)
        for r in list(live):
            counts[r] += 1
            token = int(nxt[r])
            reason = "eos" if token in eos else ("length" if counts[r] == max_new else None)
            w.emit(r, [token], reason)
            if reason:
                live.remove(r)
        if not live:
            break
        ids, mask = nxt[:, None], torch.cat([mask, torch.ones(len(prompts), 1, dtype=mask.dtype)], 1)


@pytest.mark.parametrize("positions", [False, True], ids=["no-position-ids", "position-ids"])
def test_greedy_loop(positions: bool) -> None:
    target, _, tok = models()
    eos, pad = eos_and_pad()
    prompts = [list(p) for p in prompt_ids()]
    w = specviz.watch(target, tokenizer=tok, prompts=prompts)
    greedy_loop(target, prompts, pad, eos, MAX_NEW, w, positions)
    report = check_trace(w.close())
    if positions:
        assert report.verdict == "clean" and report.exact_match == 1.0, report.violations[:3]
        return
    width = max(len(p) for p in prompts)
    padded = {r for r, p in enumerate(prompts) if len(p) < width}
    at_step0 = {(v.row, v.invariant) for v in report.violations if v.step == 0}
    assert report.verdict == "desync"
    assert {r for r, inv in at_step0 if inv == 2} == padded


def test_hf_generate_watched_is_clean() -> None:
    target, _, tok = models()
    eos, pad = eos_and_pad()
    prompts = [list(p) for p in prompt_ids()]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    w = specviz.watch(target, tokenizer=tok, prompts=prompts, name="hf-generate")
    target.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=MAX_NEW,
        do_sample=False,
        pad_token_id=pad,
        streamer=w.streamer(),
    )
    trace = w.close()
    report = check_trace(trace)
    assert report.verdict == "clean" and report.exact_match == 1.0, report.violations[:3]
    assert trace.header.draft_k == 0 and len(trace.steps) >= 2


# ----------------------------------------------------------------------------- bad use and crashes


def test_bad_use_is_one_clear_error() -> None:
    target, draft, tok = models()
    w = specviz.watch(target, draft, prompts=[[5, 6], [7, 8]])
    with pytest.raises(WatchError, match="unknown sequence 2"):
        w.emit(2, [1])
    with pytest.raises(WatchError, match="appears twice"):
        w.rows([0, 0])
    w.close(reference=False)
    with pytest.raises(WatchError, match="already closed"):
        w.close()
    with pytest.raises(WatchError, match="not a causal LM"):
        specviz.watch(target.model)
    assert issubclass(WatchError, specviz.errors.SpecvizError)


def test_a_model_an_open_watch_hooks_is_refused_until_it_closes() -> None:
    """Hooks are global state: a second open watch on the same model would record every call, and
    the first the second's too. It is refused, with no hook put on; once the first closes it opens,
    and each watch sees only its own run."""
    target, draft, tok = models()
    ids = torch.tensor([[5, 6, 7]])
    first = specviz.watch(target, draft, prompts=[[5, 6, 7]], name="first")
    with pytest.raises(WatchError, match="already hooked by an open specviz.watch \\('first'"):
        specviz.watch(draft, prompts=[[5, 6, 7]])  # the draft alone, as a target: hooked by `first`
    target(ids)
    first.emit(0, [1])
    first.close(reference=False)
    second = specviz.watch(target, prompts=[[5, 6, 7]], name="second")
    target(ids)
    second.emit(0, [1])
    assert len(second.close(reference=False).steps) == 1  # not the first watch's call too


def test_crash_inside_the_engine_leaves_an_incomplete_valid_trace(tmp_path) -> None:
    target, draft, tok = models()
    eos, pad = eos_and_pad()
    prompts = [list(p) for p in prompt_ids()]
    out = tmp_path / "crash.trace.json.gz"
    calls = {"n": 0}

    def explode(module, args, kwargs):
        calls["n"] += 1
        if calls["n"] == 12:
            raise RuntimeError("boom")

    handle = draft.register_forward_pre_hook(explode, with_kwargs=True)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            with specviz.watch(target, draft, tokenizer=tok, prompts=prompts, out=out) as w:
                generate(target, draft, prompts, K, MAX_NEW, eos, pad, watch=w)
    finally:
        handle.remove()
    trace = load_trace(out)
    assert trace.header.complete is False and trace.steps
    assert check_trace(trace).verdict == "clean"


def test_version_1_files_read_as_left_padded() -> None:
    _, trace = run_independent(Bugs())
    data = trace_to_dict(trace)
    data["header"]["schema_version"] = 1
    del data["header"]["layout"]
    for step in data["steps"]:
        for row in step["rows"]:
            for name in ("query_causal", "draft_position_ids", "draft_kv_lens"):
                row.pop(name, None)
    old = parse_trace_bytes(json.dumps(data).encode())
    assert old.header.layout == "left-padded"


def _slots_call(block: list[list[int]]):
    """One verify call of a static-slot cache: 8 key slots, a query of 3 (pending + 2 drafts)."""
    from specviz.watch.hooks import CallRecord

    rows = [[bool(v) for v in line] for line in block]
    call = CallRecord("target", None, [[5, 6, 7]], [[4, 5, 6]], True, 8, "4d-slots", [rows], 1, 3)
    call.materialize()
    return call


@pytest.mark.parametrize(
    "block,expected",
    [
        # Slots 0-3 hold the context, the query writes 4, 5, 6: 4 context slots, causal.
        ([[1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0]], ([[1, 7]], 4, True)),
        # A stale slot 7 attended by every query slot: 5 context slots (kv_len then disagrees).
        ([[1, 1, 1, 1, 1, 0, 0, 1], [1, 1, 1, 1, 1, 1, 0, 1], [1, 1, 1, 1, 1, 1, 1, 1]], ([[1, 8]], 5, True)),
        # The second draft does not see the first draft's slot: not causal, its flag is 0.
        ([[1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0, 1, 0]], ([[1, 6], [0, 1]], 4, False)),
    ],
    ids=["correct", "stale-slot", "not-causal"],
)
def test_static_slot_masks_are_read_by_counts(block, expected) -> None:
    call = _slots_call(block)
    assert call.views[0].mask_row(0, 3) == expected  # the pending token at slot 0, then two drafts
    assert call.views[0].before(2) == sum(block[2]) - 1
