"""Issue 41 red team: a static-slots engine written apart from the zoo's (`zoo/slots2.py`), read by
the watch through the API (`w.rows`, `w.emit`) and the command (`specviz watch -- python
zoo/scripts/run_engine.py slots2 ...`, nothing declared).

Its shape: a fixed number of slots over a static KV buffer per model (target and draft alike),
`cache_position` [slots, q] and a 4-D mask per row, idle rows fed pads that attend nothing, a
freed slot re-prefilled from position 0 inside the next target forward beside the other slots'
verify rows (the prefill yields the newcomer's first token), a draft with its own slot cache that
catches up 1 or 2 tokens (a whole prompt for a newcomer) before proposing k - 1 more.

The truth is independent of specviz: the correct engine equals batch-1 greedy decoding
(`shapes.reference`), and each injected bug is where the engine says it fed it (`events`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny import make_pair
from zoo import shapes, slots2
from zoo.command import watch_script

import specviz
from specviz.analysis.check import check_trace

MIXED = ([[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21], [30, 31, 32, 33, 34]], [10, 4, 10, 7, 9])
EQUAL = ([[5, 6, 7, 8], [11, 12, 13, 14], [14, 15, 16, 17], [20, 21, 22, 23], [30, 31, 32, 33]], [6, 9, 5, 8, 7])
ONE_TOKEN = ([[7], [40, 41, 42], [9], [60, 61]], [8, 5, 9, 6])  # one-token prompts, one of them recycled
# A random mix (seed 12 of the red team's sweep): six requests over two slots, budgets of 2 (a
# request that ends at its first decode step).
SWEEP12 = ([[87, 70, 88], [21, 51, 4], [64, 38, 85], [61, 91, 79, 32, 74, 3, 87], [21, 59, 50, 23, 46], [10, 76]],)
SWEEP12 += ([4, 2, 9, 6, 7, 2],)
# Seed 51: a request of budget 1 (it ends at its prefill), another of 2, over three slots.
SWEEP51 = ([[67, 73, 23, 34, 32, 73, 35], [53, 73, 62, 92, 73, 70, 83], [78, 87, 49], [38, 54, 92, 3]], [2, 1, 9, 5])
# Seed 95: budgets per request (6, 5, 7, 6) that one shared budget of 5 also fits, except that the
# third request ends by EOS at its sixth token: the command cut the first and last to 5 (a false
# alarm on the correct run) until an EOS past the budget rules the shared budget out.
SWEEP95 = ([[4, 18, 2, 77], [81], [25, 6, 73], [68, 78, 25, 81, 84, 14]], [6, 5, 7, 6])
# name -> (prompts, budgets, engine options); more requests than slots, budgets that differ.
MIXES = {
    "mixed-k3s2": (*MIXED, {"k": 3, "n_slots": 2}),
    "equal-k3s2": (*EQUAL, {"k": 3, "n_slots": 2}),
    "equal-k2s3": (*EQUAL, {"k": 2, "n_slots": 3}),
    "one_token-k3s2": (*ONE_TOKEN, {"k": 3, "n_slots": 2}),
    "one_token-k2s3": (*ONE_TOKEN, {"k": 2, "n_slots": 3}),
    "one_token-k4s3": (*ONE_TOKEN, {"k": 4, "n_slots": 3}),
    "sweep12-k2s2": (*SWEEP12, {"k": 2, "n_slots": 2}),
    "sweep51-k2s3": (*SWEEP51, {"k": 2, "n_slots": 3}),
    "sweep95-k2s2": (*SWEEP95, {"k": 2, "n_slots": 2}),
}

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


def _run(pair, tmp: Path, mode: str, mix: str, bug: str | None):
    prompts, budgets, options = MIXES[mix]
    if mode == "command":
        trace, outs, events = watch_script(tmp / f"{mix}-{bug}.trace.json", "slots2", prompts, budgets, bug, options)
        return trace, outs, [tuple(e) for e in events]
    with specviz.watch(pair.target, pair.draft, prompts=prompts, name="slots2") as w:
        outs, events = slots2.generate(pair.target, pair.draft, prompts, budgets, bug=bug, w=w, **options)
    return w.trace, outs, events


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_the_engine_is_correct_and_its_bugs_fire(pair, mix: str) -> None:
    prompts, budgets, options = MIXES[mix]
    reference = shapes.reference(pair.target, prompts, budgets)
    outs, events = slots2.generate(pair.target, pair.draft, prompts, budgets, **options)
    assert outs == reference and not events
    for bug in slots2.BUGS:
        outs, events = slots2.generate(pair.target, pair.draft, prompts, budgets, bug=bug, **options)
        assert len(events) == 1, bug
        assert (outs != reference) == (bug != "positions"), bug  # a shift of every position: RoPE is blind to it


CASES = [(mode, mix, bug) for mode in ("api", "command") for mix in sorted(MIXES) for bug in (None, *slots2.BUGS)]
# Cases the watch reads wrong are left out here and described in the red team's report.
WRONG = {
    # (The mid-run off_by_one cases, equal-k3s2 and sweep12-k2s2, read right since `infer.gains._gained`
    # lets the position fed and the context, when both show the rejected draft kept, outrank the
    # greedy fallback where the target's argmax repeats.)
    # off_by_one at the request's last step: read as greedy (documented), the verdict clean.
    ("command", "one_token-k3s2", "off_by_one"),
    ("command", "one_token-k4s3", "off_by_one"),
}


@pytest.mark.parametrize(("mode", "mix", "bug"), [c for c in CASES if c not in WRONG])
def test_slots2_is_read(pair, tmp_path: Path, mode: str, mix: str, bug: str | None) -> None:
    """Correct: clean, exact, nothing unread. Bug: never clean, the first violation at the
    engine's (step, sequence)."""
    prompts, budgets, _ = MIXES[mix]
    trace, outs, events = _run(pair, tmp_path, mode, mix, bug)
    report = check_trace(trace)
    first = report.first_violation
    if bug is None:
        assert outs == shapes.reference(pair.target, prompts, budgets)
        assert report.verdict == "clean" and report.exact_match == 1.0, (report.verdict, first, report.unreadable)
        assert report.unreadable is None and not report.violations
        return
    assert events, "the bug did not fire"
    assert report.verdict != "clean"
    seq_id = {tuple(s.prompt_ids): s.seq_id for s in trace.sequences}[tuple(prompts[events[0][1]])]
    assert first is not None and (first.step, first.seq_id) == (events[0][0], seq_id), report.violations[:3]


# The documented limit ("read, not seen", docs/watch.md): a bug at a request's last step, which no
# later call shows, reads clean through the command, with the tokens read so counted and said.
READ_AS_GREEDY = {("command", "one_token-k3s2", "off_by_one"), ("command", "one_token-k4s3", "off_by_one")}


@pytest.mark.parametrize(("mode", "mix", "bug"), sorted(c for c in WRONG if c[2] is not None))
def test_a_known_misread_is_never_silently_clean(pair, tmp_path: Path, mode: str, mix: str, bug: str) -> None:
    """The cases the command reads wrong (WRONG) with a bug: never clean, unreadable with its reason
    or a violation somewhere; the last-step ones clean only with the read-as-greedy count said."""
    trace, _, events = _run(pair, tmp_path, mode, mix, bug)
    report = check_trace(trace)
    assert events, "the bug did not fire"
    if (mode, mix, bug) in READ_AS_GREEDY:
        assert report.read_as_greedy is not None and report.read_as_greedy["tokens"] > 0
        return
    assert report.verdict != "clean", (report.verdict, report.unreadable)
    assert report.first_violation is not None or report.unreadable["why"]
