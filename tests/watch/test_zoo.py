"""The engine zoo (`tests/watch/zoo/`): small engines written without specviz's engine, one per
behaviour the watch must read from what the models were fed. Each correct engine checks clean
with exact match 1.0 (through the API and, where its rows keep their order, `specviz watch --`);
each with one injected bug is located at the (step, row) where the bug first shows, with the
right invariant. The command follows rows that change order, leave the batch or join it by their
attended context, so every engine of the zoo runs through it too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny import make_pair
from zoo import adaptive, compact, draft_subset, join, length_cut, ngram, recompute, rejoin, right_pad, sampled

import specviz
from specviz.analysis.check import check_trace
from specviz.analysis.findings import UNFOLLOWED_CHECK
from specviz.cli import main
from specviz.trace.invariants import Invariant
from specviz.trace.io import load_trace

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21]]
MAX_NEW = 10
ZOO = {  # engine: (module, its bug, the invariant the bug breaks, its rows change: order, size, newcomers)
    "right_pad": (right_pad, "positions", Invariant.POSITIONS, False),
    "adaptive": (adaptive, "stale_kv", Invariant.KV, False),
    "length_cut": (length_cut, "accounting", Invariant.ACCOUNTING, False),
    "recompute": (recompute, "mask", Invariant.KV, False),
    "draft_subset": (draft_subset, "draft_positions", Invariant.POSITIONS, False),
    "ngram": (ngram, "positions", Invariant.POSITIONS, False),
    "rejoin": (rejoin, "stale_kv", Invariant.KV, True),
    "compact": (compact, "stale_kv", Invariant.KV, True),
    "join": (join, "positions", Invariant.POSITIONS, True),
}
# More bugs of the engines whose rows change, each located through the API and the command.
MORE_BUGS = [("compact", "positions", Invariant.POSITIONS)]


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


def run_api(pair, name: str, bug: str | None = None, **options):
    module = ZOO[name][0]
    with specviz.watch(pair.target, pair.draft, prompts=PROMPTS, name=name) as w:
        outs, events = module.generate(pair.target, pair.draft, PROMPTS, MAX_NEW, bug=bug, w=w, **options)
    return w.trace, outs, events


def assert_clean(trace, outs=None) -> None:
    report = check_trace(trace)
    assert report.verdict == "clean" and report.exact_match == 1.0, report.violations[:3]
    assert not report.violation_count and not trace.header.options.get("watch_notes")
    assert not [s for s in report.skipped_checks if s.check in ("draft", "greedy acceptance")]
    written = {s.seq_id: 0 for s in trace.sequences}
    for step in trace.steps:
        for row in step.rows:
            written[row.write_seq] += len(row.emitted)
    assert all(n == MAX_NEW for n in written.values())  # every step read, every token placed
    if outs is not None:
        assert [s.output_ids for s in trace.sequences] == outs


@pytest.mark.parametrize("name", list(ZOO))
def test_correct_engine_checks_clean(pair, name: str) -> None:
    trace, outs, _ = run_api(pair, name)
    assert_clean(trace, outs)
    if name in ("adaptive", "length_cut", "draft_subset", "ngram"):
        lengths = {len(r.draft_tokens) for s in trace.steps for r in s.rows}
        assert len(lengths) > 1  # the drafts really are ragged


def test_undeclared_draft_rows_are_matched_by_tokens(pair) -> None:
    trace, outs, _ = run_api(pair, "draft_subset", declare=False)
    assert_clean(trace, outs)


BUGS = [(name, spec[1], spec[2]) for name, spec in ZOO.items()] + MORE_BUGS


@pytest.mark.parametrize(("name", "bug", "invariant"), BUGS)
def test_injected_bug_located(pair, name: str, bug: str, invariant: Invariant) -> None:
    trace, _, events = run_api(pair, name, bug)
    assert events, f"{bug} never fired"
    assert_located(trace, events[0], invariant)


def assert_located(trace, event: tuple[int, int], invariant: Invariant) -> None:
    """The first violation is the bug's (step, sequence), at that sequence's row, with its invariant."""
    step, seq = event
    report = check_trace(trace)
    v = report.first_violation
    assert v is not None and (v.step, v.seq_id, v.invariant) == (step, seq, invariant), report.violations[:3]
    assert v.row == next(r.row for r in trace.steps[v.step_index].rows if r.seq_id == seq)
    keys = [(x.step_index, x.row, x.invariant, x.field, repr(x.expected), repr(x.actual)) for x in report.violations]
    assert len(keys) == len(set(keys))  # each violation once


SCRIPT = """
import sys
import torch
import transformers as tf

from zoo import {name} as engine

config = tf.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                        bos_token_id=2, eos_token_id=1, pad_token_id=0)
torch.manual_seed(0)
target = tf.AutoModelForCausalLM.from_config(config).eval()
draft = tf.AutoModelForCausalLM.from_config(config).eval()
draft.load_state_dict(target.state_dict())
gen = torch.Generator().manual_seed(7)
with torch.no_grad():
    for p in draft.parameters():
        if p.dim() >= 2:
            p.add_(torch.randn(p.shape, generator=gen) * p.std() * 0.15)
bug = sys.argv[1] if len(sys.argv) > 1 else None
outs, events = engine.generate(target, draft, {prompts!r}, {max_new}, bug=bug)
print("EVENTS", events)
"""


def run_cli(tmp_path: Path, name: str, bug: str | None = None):
    script = tmp_path / f"{name}.py"
    script.write_text(SCRIPT.format(name=name, prompts=PROMPTS, max_new=MAX_NEW))
    out = tmp_path / f"{name}.trace.json"
    assert main(["watch", "--out", str(out), "--", "python", str(script)] + ([bug] if bug else [])) == 0
    return load_trace(out)


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("name", list(ZOO))
def test_correct_engine_through_the_cli(tmp_path: Path, name: str) -> None:
    trace = run_cli(tmp_path, name)
    assert [s.prompt_ids for s in trace.sequences] == PROMPTS
    assert_clean(trace)
    if ZOO[name][3]:  # the rows really changed, and were followed
        held = [[r.seq_id for r in step.rows] for step in trace.steps]
        assert len({len(h) for h in held}) > 1 or any(h != sorted(h) for h in held)
        assert not [s for s in check_trace(trace).skipped_checks if s.check == UNFOLLOWED_CHECK]


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize(("name", "bug", "invariant"), [b for b in BUGS if ZOO[b[0]][3] and b[0] != "rejoin"])
def test_injected_bug_located_through_the_cli(
    tmp_path: Path, name: str, bug: str, invariant: Invariant, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows that move, leave or join are followed by their context, so the bug is read at its own
    (step, sequence): a row whose cache did not move with it is matched by its pending token."""
    trace = run_cli(tmp_path, name, bug)
    events = eval(capsys.readouterr().out.split("EVENTS", 1)[1].strip())  # noqa: S307 - our own print
    assert events, f"{bug} never fired"
    assert_located(trace, events[0], invariant)


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("name", ["right_pad", "recompute"])
def test_injected_bug_through_the_cli(tmp_path: Path, name: str, capsys) -> None:
    _, bug, invariant, _ = ZOO[name]
    trace = run_cli(tmp_path, name, bug)
    events = eval(capsys.readouterr().out.split("EVENTS", 1)[1].strip())  # noqa: S307 - our own print
    v = check_trace(trace).first_violation
    # Without declared prompts, a mask that attends the padding makes the pads part of the prompt
    # as the command reads it: the same (step, row) shows as positions that skip them.
    allowed = {invariant, Invariant.POSITIONS} if name == "recompute" else {invariant}
    assert v is not None and (v.step, v.seq_id) == events[0] and v.invariant in allowed


def test_draft_checks_that_could_not_run_are_listed_with_their_steps(pair) -> None:
    """Rows whose draft calls were not found: the draft checks are listed as skipped, with the count."""
    trace, _, _ = run_api(pair, "adaptive")
    for step in trace.steps[:2]:
        for row in step.rows:
            row.draft_kv_len = row.draft_kv_lens = row.draft_position_ids = None
    report = check_trace(trace)
    assert report.verdict == "clean"
    (draft,) = [s for s in report.skipped_checks if s.check == "draft"]
    assert (draft.steps, draft.of) == (2, len(trace.steps))
    assert str(draft).startswith(f"draft checks skipped on 2 of {len(trace.steps)} steps")
    assert report.to_dict()["skipped_checks"][0].keys() == {"check", "reason", "steps", "of"}


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_re_prefill_that_caches_the_pending_token_is_found_at_its_step(tmp_path: Path, capsys) -> None:
    """`rejoin`'s bug through the command: its re-prefill feeds every row's pending token too, so
    the command reads that call as a step of the rows (a recompute loop feeds the same) and the
    rows' next call as feeding a finished row again. The bug still shows at its step, on a row it
    touched (it touches every row of that call), not necessarily at the API's first row."""
    trace = run_cli(tmp_path, "rejoin", "stale_kv")
    (step, _), *_ = eval(capsys.readouterr().out.split("EVENTS", 1)[1].strip())  # noqa: S307 - our own print
    report = check_trace(trace)
    assert report.verdict == "desync" and report.first_violation.step == step


def test_sampled_engine_is_checked_without_an_oracle(pair) -> None:
    """Rejection sampling, declared: clean on accounting, positions and KV (no token equality
    asked), every token placed; the same engine leaving rejected drafts attended is located at the
    step and row where a stale slot is first attended. T is low because the tiny models' logits
    are small: at T = 0.8 every draft is accepted and no residual is ever sampled."""
    with specviz.watch(pair.target, pair.draft, prompts=PROMPTS, temperature=0.05) as w:
        outs, _ = sampled.generate(pair.target, pair.draft, PROMPTS, MAX_NEW, w=w, temperature=0.05)
    report = check_trace(w.trace)
    assert report.verdict == "clean" and not report.violation_count, report.violations[:3]
    assert [s.output_ids for s in w.trace.sequences] == outs
    assert w.trace.header.sampling.temperature == 0.05 and w.trace.sequences[0].reference_ids is None
    assert {s.check for s in report.skipped_checks} >= {"greedy acceptance", "output equivalence"}
    assert "draft" not in {s.check for s in report.skipped_checks}  # the sampled drafts were matched
    assert sum(len(r.emitted) for s in w.trace.steps for r in s.rows) == MAX_NEW * len(PROMPTS)
    rows = [r for s in w.trace.steps for r in s.rows]
    assert any(r.accepted for r in rows) and any(r.accepted < len(r.draft_tokens) for r in rows)

    with specviz.watch(pair.target, pair.draft, prompts=PROMPTS, temperature=0.05) as w:
        _, events = sampled.generate(pair.target, pair.draft, PROMPTS, MAX_NEW, bug="stale_kv", w=w, temperature=0.05)
    v = check_trace(w.trace).first_violation
    assert events and v is not None and (v.step, v.seq_id, v.invariant) == (*events[0], Invariant.KV)


@pytest.mark.parametrize("draft_cache", [False, True])
def test_sampled_engine_undeclared_is_unreadable_with_why(pair, draft_cache: bool) -> None:
    """Not told it samples, the watch sees its drafter feed tokens that are not the draft's argmax
    (re-read rows, or one token per call over the draft's cache): unreadable from there, with the
    fix, never read against the argmax (that read desync with false violations before)."""
    with specviz.watch(pair.target, pair.draft, prompts=PROMPTS) as w:
        sampled.generate(pair.target, pair.draft, PROMPTS, MAX_NEW, w=w, temperature=0.05, draft_cache=draft_cache)
    report = check_trace(w.trace)
    assert report.verdict == "unreadable" and not report.violations, report.violations[:3]
    assert "not the draft's argmax" in report.unreadable["why"] and "temperature=" in report.unreadable["why"]
