"""Issue 41's fourth blind round (2026-12-08), in a file of its own so the suite's two workers can
take it beside the others: two engines of `tests/watch/blind/` written from the user docs alone, on
the embedded pair, truth from an unwatched batch-1 decode (`blind/truth.py`). The round (and a
fifth of two more engines, e22 and e23), with every case before and after, is in
`benchmarks/results/blind-round4-2026-12-08.md`."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_blind_round import read_right

FOURTH = [
    # A draft model that proposes all its drafts in one forward (fed the pending token, then
    # placeholders: PARD-style). Through the command its correct run read desync, 15 false violations
    # on verify rows taken for new sequences, then unreadable from step 2: no run of draft calls
    # proposed those drafts one a call (`calls.CallReader._proposed_at_once`).
    ("e20_pard.py", [], None, "command"),
    ("e20_pard.py", ["--bug", "target_pos", "--n", "6"], (1, 0, "position-contiguity"), "command"),
    ("e20_pard.py", ["--n", "6"], None, "api"),
    # Self-speculative early exit (LayerSkip-like): the drafts come from the target's own first
    # layers, called as submodules, so no draft model and no hooked draft call. Read right both ways
    # before this round's change; kept so that it stays so.
    ("e21_earlyexit.py", ["--n", "6"], None, "command"),
    ("e21_earlyexit.py", [], None, "api"),
    ("e21_earlyexit.py", ["--bug", "pos_holes", "--n", "6"], (1, 0, "position-contiguity"), "command"),
    ("e21_earlyexit.py", ["--bug", "commit_extra"], (0, 0, "token-accounting"), "api"),
    # Two proposers (the draft model's chain and a prompt-lookup chain) merged into a token tree per
    # row, verified under a 4-D tree mask: read right both ways on its correct runs.
    ("e22_multidraft.py", [], None, "command"),
    ("e22_multidraft.py", ["--bug", "stale", "--n", "6"], (0, 2, "kv-consistency"), "api"),
    # Drafting one verify ahead: the next step's drafts proposed before this verify and kept where
    # every draft was accepted. Its correct run read desync both ways (the look-ahead calls taken for
    # the drafts' proposers, at the wrong positions) until the chain is also sought among the draft
    # calls before the previous verify (`calls.CallReader._ahead`). Through the command the reused
    # rows' gains are still misread (exact 0.6 on right outputs): not pinned, see the round's results.
    ("e23_draftahead.py", [], None, "api"),
    ("e23_draftahead.py", ["--bug", "no_rollback"], (2, 0, "kv-consistency"), "api"),
    ("e23_draftahead.py", ["--bug", "stale_guess"], (3, 0, "token-accounting"), "api"),
]


@pytest.mark.parametrize(("engine", "args", "expected", "mode"), FOURTH)
def test_a_fourth_round_engine_is_read_right(tmp_path: Path, engine: str, args: list[str], expected, mode: str) -> None:
    read_right(tmp_path, engine, args, expected, mode)
