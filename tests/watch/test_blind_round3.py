"""Issue 41's third blind round (2026-12-07), run apart from the second (`test_blind_round.py`, whose
runner it shares) so that the two workers of the suite take one file each: each engine of
`tests/watch/blind/` (e7-e19) written from the user docs alone, on the embedded trained pair with
text prompts, truth from an unwatched batch-1 decode (`blind/truth.py`); the whole round with every
case before and after is in `benchmarks/results/blind-round3-2026-12-07.md`."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_blind_round import read_right

# The third round (2026-12-07, e7-e18, written by twelve engineers from the user docs alone, each run
# both ways on n = 5 and 6 prompts): per-row draft counts that change every step, requests arriving
# into recycled slots of a padded batch (each prefilled alone and spliced in), a 4-D tree mask over
# caches compacted to the committed path, additive float masks on a bfloat16 target with caches
# cropped to the shortest row, a StaticCache, right-padded prompts, two micro-batches taking turns,
# rows verified one at a time, an EQSPEC-like batch realigned by rolling its caches, and a shared
# system prefix prefilled once. Before this round's fixes the tree engine's correct run read
# unreadable at step 0 through the command (two leaves chose alike: `infer.gains.step_gain`), the
# float mask's `peek` read unexplained with no violation (a `query_causal` of False was not written
# to JSON), and `maxpos` also blamed seq 0's drafts on another row fed alike
# (`calls.CallReader._chain_query`).
THIRD = [
    ("e7_adaptive.py", ["--n", "6"], None, "command"),
    ("e7_adaptive.py", ["--bug", "maxpos", "--n", "6"], (1, 0, "position-contiguity"), "api"),
    ("e8_arrivals.py", ["--n", "6"], None, "command"),
    ("e9_tree4d.py", ["--n", "6"], None, "command"),
    ("e10_floatmask.py", ["--n", "6"], None, "api"),
    ("e10_floatmask.py", ["--bug", "peek"], (0, 0, "kv-consistency"), "api"),
    # A StaticCache with a 2-D mask over its whole width read 185 false violations both ways (the
    # query read from the mask's last columns: `hooks`); rows verified one at a time, each on its own
    # cache, and two micro-batches taking turns were followed against the last call, not the last
    # on the same cache (`infer.follow`): 64 false violations, and unreadable from step 2.
    ("e8_arrivals.py", ["--bug", "ghost", "--n", "6"], (12, 4, "kv-consistency"), "command"),
    ("e11_staticcache.py", ["--n", "6"], None, "command"),
    ("e12_rightpad.py", ["--n", "6"], None, "command"),
    ("e12_rightpad.py", ["--bug", "padkv"], (1, 0, "kv-consistency"), "command"),
    ("e13_twobatches.py", ["--n", "6"], None, "command"),
    ("e14_perrow.py", ["--n", "6"], None, "command"),
    ("e14_perrow.py", ["--bug", "crop1", "--n", "6"], (12, 0, "kv-consistency"), "command"),
    # A slot holding another token's key under a right mask (a realignment rolled one slot too far,
    # a tree's compaction gathering another branch's KV) read unexplained with no violation until
    # the watch compared layer-0 keys (`watch.content`).
    ("e15_roll.py", ["--bug", "shift1"], (2, 0, "kv-consistency"), "command"),
    ("e9_tree4d.py", ["--bug", "gather"], (3, 3, "kv-consistency"), "api"),
    # A system prefix prefilled once and expanded to every row: through the command the prefix was a
    # sequence and each row a newcomer over stale KV, 150 false violations (`infer.follow._new`).
    ("e16_prefix.py", ["--n", "6"], None, "command"),
    ("e16_prefix.py", [], None, "api"),
    # Suffix positions that restart at 0 (not counting the prefix): the prefix was read as a sequence
    # of its own, since only positions that count it made it a prefix, and the bug was flagged a step
    # late on stale KV with the sequences renumbered. A prefix is now read by what its rows attend.
    ("e16_prefix.py", ["--bug", "sufpos"], (0, 0, "position-contiguity"), "command"),
    # Tries of n-gram candidates over compacted caches: a cache compacted so that its width grew by the
    # whole query block read as KV kept by index (a false `kept_nodes` at step 11: `tree.kept_nodes`).
    ("e17_ngramtree.py", [], None, "api"),
    # Its pad query slots attend their own key only: read as tokens through the command (310 false
    # violations) until a slot that attends only itself, unseen, in a row reading its cache was a pad.
    ("e17_ngramtree.py", ["--n", "6"], None, "command"),
    ("e17_ngramtree.py", ["--bug", "sibling", "--n", "6"], (7, 4, "kv-consistency"), "api"),
    # Rejection sampling through the command: unreadable from its first verify, no violation (the
    # steps before the second non-argmax draft were read as greedy: 20 false violations).
    ("e18_sampled.py", [], "unreadable", "command"),
    # Two pairs of identical prompts, rows dropped as each finishes: at a twin's last step it drafts
    # fewer tokens (less budget left) than its twin, both choose alike, and the next call holds one of
    # them. Through the command the correct run read unreadable from step 6, the twins told apart by
    # the drafts they were fed though they gained alike (`infer.match._likeness`); its KV bug then
    # read unreadable from there too.
    ("e19_dupes.py", ["--n", "6"], None, "command"),
    ("e19_dupes.py", ["--bug", "wrongdrop", "--n", "6"], (5, 2, "kv-consistency"), "command"),
]


@pytest.mark.parametrize(("engine", "args", "expected", "mode"), THIRD)
def test_a_third_round_engine_is_read_right(tmp_path: Path, engine: str, args: list[str], expected, mode: str) -> None:
    read_right(tmp_path, engine, args, expected, mode)
