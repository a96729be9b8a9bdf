"""Static batch slots recycled CUDA-graph style (`zoo/slots.py`: a static KV cache [slots,
max_len] written at each row's `cache_position`, a 4-D mask over the slot's positions, idle slots
fed pads that attend nothing, a finished request's slot prefilled from position 0 for the next
waiting one), through the API (`w.rows`, the truth of who is where) and the command (`specviz
watch -- python zoo/scripts/run_engine.py slots ...`, in-process), with prompts of mixed lengths
and all of one length.

The truth is independent of specviz: the correct engine equals batch-1 greedy decoding
(`shapes.reference`) and each injected bug is where the engine says it fed it (`events`). Before
the command read a recycled slot's prefill (attending only its own tokens) as a new sequence, the
correct run drew false violations: the prefill was read as the old sequence's next step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny import make_pair
from zoo import shapes, slots
from zoo.command import watch_script

import specviz
from specviz.analysis.check import check_trace
from specviz.trace.invariants import Invariant

BUDGETS = [10, 4, 10, 7, 9]  # requests finish at different steps; their slots are recycled
PROMPTS = {
    "mixed": ([[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21], [30, 31, 32, 33, 34]], BUDGETS),
    "equal": ([[5, 6, 7, 8], [11, 12, 13, 14], [14, 15, 16, 17], [20, 21, 22, 23], [30, 31, 32, 33]], BUDGETS),
    # Two requests end at one step: one slot is prefilled while the others idle, one stays idle a
    # call longer (before, stale_len was read as the other live rows' false accounting at step 1).
    "twice": (
        [[50, 37, 20, 26, 89, 3], [46, 67, 62, 80, 13, 45], [73, 81, 92, 8, 51, 24], [93, 60, 95, 57, 23, 24]]
        + [[33, 9, 17, 19, 67, 78]],
        [4, 9, 4, 7, 6],
    ),
}
# The first violation each bug draws at the engine's (step, sequence): a newcomer positioned after
# the old request (both bugs), whose first step also attends the old request's KV ("stale_len").
INVARIANTS = {"stale_len": {Invariant.POSITIONS, Invariant.KV}, "positions": {Invariant.POSITIONS}}
INVARIANTS["continued"] = INVARIANTS["stale_len"]

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


def _run(pair, tmp: Path, mode: str, name: str, bug: str | None):
    prompts, budgets = PROMPTS[name]
    if mode == "command":
        return watch_script(tmp / f"slots-{name}-{bug}.trace.json", "slots", prompts, budgets, bug)
    with specviz.watch(pair.target, pair.draft, prompts=prompts, name="slots") as w:
        outs, events = slots.generate(pair.target, pair.draft, prompts, budgets, bug=bug, w=w)
    return w.trace, outs, events


@pytest.mark.parametrize("prompts", sorted(PROMPTS))
def test_the_engine_is_a_correct_slots_engine(pair, prompts: str) -> None:
    outs, events = slots.generate(pair.target, pair.draft, *PROMPTS[prompts])
    assert outs == shapes.reference(pair.target, *PROMPTS[prompts]) and not events


@pytest.mark.parametrize("bug", [None, "stale_len", "positions", "continued"])
@pytest.mark.parametrize("prompts", sorted(PROMPTS))
@pytest.mark.parametrize("mode", ["api", "command"])
def test_slots_engine_is_read(pair, tmp_path: Path, mode: str, prompts: str, bug: str | None) -> None:
    """Correct: clean, exact, read to the end. Bug: its first violation at the engine's (step,
    sequence), with an invariant it breaks; never clean. The command reads a newcomer whose
    prefill of ONE token attends the old request's KV ("continued", the mixed prompts' [20, 21])
    as the old request's next step (a limit of docs/watch-command.md): never clean, not located."""
    trace, outs, events = _run(pair, tmp_path, mode, prompts, bug)
    report = check_trace(trace)
    v = report.first_violation
    if (bug, mode, prompts) == ("continued", "command", "mixed"):
        assert events and report.verdict != "clean" and report.exact_match != 1.0
        return
    if bug is None:
        assert outs == shapes.reference(pair.target, *PROMPTS[prompts])
        assert report.verdict == "clean" and report.exact_match == 1.0, (report.verdict, v, report.unreadable)
        assert report.unreadable is None and not report.violations
        return
    assert events, "the bug did not fire"
    assert report.verdict != "clean"
    seq_id = {tuple(s.prompt_ids): s.seq_id for s in trace.sequences}[tuple(PROMPTS[prompts][0][events[0][1]])]
    assert v is not None and (v.step, v.seq_id) == (events[0][0], seq_id), (report.verdict, report.violations[:3])
    located = {x.invariant for x in report.violations if (x.step, x.seq_id) == (v.step, v.seq_id)}
    assert located == INVARIANTS[bug], located
