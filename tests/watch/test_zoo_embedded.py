"""Zoo engines on specviz's embedded *trained* pair with text prompts (no download), through the
API and the command.

The tiny random models the rest of the zoo runs on rarely choose what a prompt says next; a trained
model does, often: its choice at a prefill chunk's last token is the next chunk's first token, and
its draft proposes the same tokens after the same token for two sequences. Each coincidence once
read a correct run wrong (issue 41's blind round, 2026-12-07):

- a last prefill chunk declared with `w.batch(drafts=0)` on an engine with no draft model: the emit
  after it was credited to the chunk before (`attribution._Rows.pending_slot` read the chunk's first
  token as pending, against the declared drafts), 6-7 false violations;
- a static slot sitting out a forward that prefills another slot (fed only padding): the command
  read it as a step of its sequence that emitted nothing (POSITIONS, KV);
- two packed sequences whose draft rows were fed the same token and proposed the same one: the
  command took the first such row for both (`calls._draft_row`), so one read the other's draft
  positions;
- a packed engine that declares only its emits: a late prompt whose end the follower placed
  elsewhere started "no declared prompt" (unreadable).

Truth is independent of specviz: `shapes.reference` (batch-1 greedy decoding without hooks) and
each engine's own `events` (where it fed its bug).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from zoo import chunkmix, packed, shapes, slots
from zoo.command import watch_script

import specviz
from specviz.analysis.check import check_trace

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

TEXTS = [
    "The cat sat on the mat and",
    "Once upon a time, in a small village near the sea, there lived",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog again and again and",
    "In 1905 Albert Einstein published four papers that changed physics forever. The first explained the",
]
BUDGETS = [16, 20, 24, 18, 22]
ENGINES = {"chunkmix": chunkmix, "packed": packed, "slots": slots}
USES_DRAFT = {"packed", "slots"}
# (engine, options, mode): the shapes each coincidence above misread.
SHAPES = [
    ("chunkmix", {"declare": 1, "chunk": 5}, "api"),
    ("chunkmix", {"declare": 1, "chunk": 8}, "api"),
    ("chunkmix", {"chunk": 8}, "command"),
    ("packed", {}, "api"),
    ("packed", {}, "command"),
    ("slots", {"slots": 2}, "api"),
    ("slots", {"slots": 2}, "command"),
]
# (engine, options, mode, bug): each bug's first violation at the engine's first event. Read wrong,
# left out (never clean; docs/watch-command.md): the command places chunkmix's "chunk_trim" at the
# step before (8-token chunks).
BUGS = [("chunkmix", {"declare": 1, "chunk": 5}, "api", bug) for bug in ("chunk_pos0", "chunk_trim", "overaccept")] + [
    ("packed", {}, "command", "positions"),
    ("packed", {}, "command", "kv_leak"),
    ("packed", {}, "command", "stale_kv"),
    ("slots", {"slots": 2}, "command", "stale_len"),
    ("slots", {"slots": 2}, "command", "positions"),
    ("slots", {"slots": 2}, "command", "continued"),
]


@functools.cache
def _pair():
    from specviz.engine.models import load_pair

    return load_pair(device="cpu")


@functools.cache
def _prompts() -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(_pair().tokenizer(text).input_ids) for text in TEXTS)


@functools.cache
def _reference() -> list[list[int]]:
    return shapes.reference(_pair().target, [list(p) for p in _prompts()], BUDGETS)


def _run(tmp: Path, name: str, options: dict[str, int], mode: str, bug: str | None):
    pair, prompts = _pair(), [list(p) for p in _prompts()]
    if mode == "command":
        out = tmp / f"{name}-{bug}.trace.json"
        return watch_script(out, name, prompts, BUDGETS, bug, options, script_args=["--embedded"])
    draft = pair.draft if name in USES_DRAFT else None
    with specviz.watch(pair.target, draft, prompts=prompts, name=name) as w:
        outs, events = ENGINES[name].generate(pair.target, draft, prompts, BUDGETS, bug=bug, w=w, **options)
    return w.trace, outs, events


@pytest.mark.parametrize(("name", "options", "mode"), SHAPES)
def test_a_correct_run_on_a_trained_pair_reads_clean(tmp_path: Path, name: str, options: dict, mode: str) -> None:
    trace, outs, events = _run(tmp_path, name, options, mode, None)
    assert outs == _reference() and not events  # the engine is correct
    report = check_trace(trace)
    assert report.verdict == "clean" and not report.violation_count, (report.unreadable, report.violations[:3])
    assert report.exact_match == 1.0


@pytest.mark.parametrize(("name", "options", "mode", "bug"), BUGS)
def test_a_bug_on_a_trained_pair_is_located(tmp_path: Path, name: str, options: dict, mode: str, bug: str) -> None:
    trace, outs, events = _run(tmp_path, name, options, mode, bug)
    assert events, f"{bug} never fired"
    report = check_trace(trace)
    first = report.first_violation
    assert report.verdict != "clean" and first is not None, report.unreadable
    assert (first.step, first.seq_id) == tuple(events[0]), report.violations[:3]
    if outs != _reference():
        assert report.exact_match is None or report.exact_match < 1.0


@pytest.mark.parametrize("chunk", [3, 5])
def test_an_untold_prompt_end_stops_reading_without_a_false_violation(tmp_path: Path, chunk: int) -> None:
    """Small chunks on the trained pair: a chunk's last choice is the next chunk's first token, so
    the command reads the prompt's end there (a prefill whose choice was fed), and the next "step"
    keeps drafts the target refused, exactly as the next chunk would: where the prompt ends is not
    told. Reading stops at that call (none of its rows read, nor greedy ends for it), with that
    reason; every step read before it holds (it read 4 and 14 false violations before)."""
    trace, outs, events = _run(tmp_path, "chunkmix", {"chunk": chunk}, "command", None)
    assert outs == _reference() and not events
    report = check_trace(trace)
    assert not report.violation_count, report.violations[:3]
    assert report.verdict == "unreadable" and "prompt ends is not told" in report.unreadable["why"]
