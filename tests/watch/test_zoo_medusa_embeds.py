"""Medusa-style heads over a bfloat16 target fed `inputs_embeds` (`zoo.medusa_embeds`): the watch
reads the target's token ids back from the vectors it is fed (matching the embedding table).
Through the API and through the command, with mixed prompt lengths and with all-equal ones: a
correct run is clean and equal to batch-1 greedy of the same bf16 target (`shapes.reference`, fed
ids: the same embedding rows); each injected bug is found at its (step, sequence) and never clean.

bf16 numerics: the padded batch and batch-1 decoding can legitimately part at a near-tie. The
prompts here are ones where they agree; where they do not (e.g. equal-length prompts
[[95, 16, 11, 49, 92], [62, 50, 8, 80, 88], [24, 78, 47, 44, 37], [93, 45, 82, 42, 63],
[77, 54, 31, 81, 13]], budgets 10, 5, 9, 6, 3: the engine's outputs differ from batch-1 greedy), the
API and the command both say "numerical", with no violation.
"""

from __future__ import annotations

import pytest
import torch
from tiny import make_pair
from zoo import medusa_embeds, shapes
from zoo.command import watch_script

import specviz
from specviz.analysis.check import check_trace
from specviz.trace.invariants import Invariant

MIXED = ([[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21], [30, 31, 32, 33, 34]], [10, 4, 10, 7, 9])
EQUAL = ([[91, 86, 70, 6], [62, 34, 86, 9], [23, 17, 50, 63], [34, 51, 72, 16]], [6, 3, 6, 9])
# A stale-KV row at step 0 whose target choice after its whole query equals its greedy pick (the
# tiny target repeats itself): through the command the row's next call reads alike as a prompt
# chunk (prompt + both drafts, no bug) and as a step that kept its rejected slots attended. The
# position fed to the pending token tells them apart (a chunk's sits after all it attends); before
# that, the bug was blamed as POSITIONS, not KV, at its step. One pair of equal lengths, one mixed.
TIE_EQUAL = ([[72, 79, 94], [25, 31, 19]], [10, 9])
TIE_MIXED = (
    [[86, 70, 6, 62, 34, 86, 9], [23, 17, 50, 63], [34, 51, 72, 16, 76, 34, 4], [30, 55, 38, 26, 52, 23, 12]],
    [5, 10, 5, 5],
)
# A budget per prompt; the first sequence ends at 3 tokens with a one-token last step (pinning a
# shared budget of 3) while the second repeats one token and keeps decoding alone, accepting
# drafts. The command once read that repeat past 3 as a finished row fed along and cut the second
# (and third) outputs to 3 tokens: a correct run read clean on cut outputs, and the positions bug
# (at step 2, past the cut) read clean too. A row fed along gains one token a call; this one
# gained two at a call, so it was decoding under a budget of its own.
BUDGET = ([[27, 31, 53, 75], [3, 85, 35, 89, 48], [93, 25]], [3, 7, 4])
CASES = {"mixed": MIXED, "equal": EQUAL, "tie_equal": TIE_EQUAL, "tie_mixed": TIE_MIXED, "budget": BUDGET}
BUGS = {"stale_kv": Invariant.KV, "positions": Invariant.POSITIONS}


@pytest.fixture(scope="module")
def target():
    return make_pair("llama").target.to(medusa_embeds.DTYPE)  # the command's target, cast alike


@pytest.fixture(scope="module")
def heads(target):
    return medusa_embeds.Heads(target)


def assert_outcome(report, outs, events, target, case: str, bug) -> None:
    prompts, budgets = CASES[case]
    first = report.first_violation
    if bug is None:
        assert outs == shapes.reference(target, prompts, budgets)
        assert report.verdict == "clean" and report.exact_match == 1.0, (report.unreadable, first)
        return
    assert report.verdict != "clean"
    assert first is not None, report.unreadable
    assert (first.step, first.seq_id, first.invariant) == (*events[0], BUGS[bug]), report.violations[:3]


@pytest.mark.parametrize("bug", [None, *BUGS])
@pytest.mark.parametrize("case", sorted(CASES))
def test_through_the_api(target, heads, case: str, bug) -> None:
    prompts, budgets = CASES[case]
    with specviz.watch(target, prompts=prompts, name="medusa-embeds") as w:
        outs, events = medusa_embeds.generate(target, heads, prompts, budgets, bug=bug, w=w)
    assert_outcome(check_trace(w.trace), outs, events, target, case, bug)


@pytest.mark.parametrize("bug", [None, *BUGS])
@pytest.mark.parametrize("case", sorted(CASES))
def test_through_the_command(tmp_path, target, case: str, bug) -> None:
    prompts, budgets = CASES[case]
    trace, outs, events = watch_script(tmp_path / "embeds.trace.json", "medusa_embeds", prompts, budgets, bug)
    report = check_trace(trace)
    assert_outcome(report, outs, events, target, case, bug)
    if bug is None and case == "budget":  # every token the engine gave was read, none cut at 3
        # (Not so for every case: in tie_equal the first sequence, budget 10, repeats one token one
        # a call past the second's 9, which reads as a finished row fed along and is cut to 9,
        # docs/watch-command.md's budget limit; clean on the tokens read.)
        assert [s.output_ids for s in sorted(trace.sequences, key=lambda s: s.seq_id)] == outs


def test_the_target_is_fed_embeddings_in_bf16(target) -> None:
    assert target.dtype == torch.bfloat16 and target.get_input_embeddings().weight.dtype == torch.bfloat16
