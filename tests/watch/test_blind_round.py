"""Issue 41's second blind round (2026-12-07): six engines written from the user docs alone, by an
engineer who never read specviz's source (`tests/watch/blind/`, kept as written but for lint), on
the embedded trained pair with text prompts: a draft-model tree verifier (left padded, rows
leaving, two prompts of one length), static slots recycled CUDA-graph style, n-gram drafts with
chunked prefill in one packed forward, Medusa heads on a bfloat16 target fed `inputs_embeds`,
packed trees reordered every step, and an EXSPEC-like regrouping engine.

Each engine prints `MATCH` when its outputs equal batch-1 greedy decoding of the target computed
without any watch (`truth.py`, `truth.json`): the truth is independent of specviz. Each correct run
must read clean through the API and the command; each bug here is located at the (step,
sequence) its engine's docstring names. Before this round's fixes, four of the correct runs
below read DESYNC (e2 command, e2 `--first` both ways, e3 both ways), `leave_shift` was blamed
one step early, the command named `kept_other` token accounting and read `stale_branch` as
unreadable.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specviz.analysis.check import check_trace
from specviz.trace.io import load_trace

HERE = Path(__file__).parent / "blind"
ROOT = Path(__file__).parents[2]

# (engine, its arguments, expected: None for a correct run, else (step, sequence, invariant slug),
# mode). Every correct run both ways; each bug one way (the round ran both: same locations).
CORRECT = [
    ("e1_tree.py", []),
    ("e2_slots.py", []),
    ("e2_slots.py", ["--first"]),  # a recycled slot's prefill yields a token beside an idle slot
    ("e3_chunked.py", []),
    ("e4_medusa.py", []),
    ("e5_packed_tree.py", []),
    ("e6_exspec.py", []),
]
CASES = [(engine, args, None, mode) for engine, args in CORRECT for mode in ("api", "command")] + [
    ("e1_tree.py", ["--bug", "leave_shift"], (6, 1, "kv-consistency"), "command"),
    # A stale branch leaves rows unexplained beside two prompts alike so far: the order kept is read.
    ("e1_tree.py", ["--bug", "stale_branch"], (0, 0, "kv-consistency"), "command"),
    ("e2_slots.py", ["--bug", "stale_len"], (9, 3, "kv-consistency"), "command"),
    ("e3_chunked.py", ["--bug", "rejected_kv"], (2, 0, "kv-consistency"), "api"),
    ("e5_packed_tree.py", ["--bug", "len_shift"], (5, 3, "position-contiguity"), "api"),
    # Node 1's KV kept where the path went through node 4: read as KV, not as node 1 taken (the token
    # fed next is node 4's choice, not node 1's: `infer.gains.step_gain`).
    ("e5_packed_tree.py", ["--bug", "kept_other"], (2, 0, "kv-consistency"), "command"),
]
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
CASES += [
    ("e7_adaptive.py", ["--n", "6"], None, "command"),
    ("e7_adaptive.py", ["--bug", "maxpos", "--n", "6"], (1, 0, "position-contiguity"), "api"),
    ("e8_arrivals.py", ["--n", "6"], None, "command"),
    ("e8_arrivals.py", ["--bug", "oldpos", "--n", "6"], (12, 3, "position-contiguity"), "command"),
    ("e9_tree4d.py", ["--n", "6"], None, "command"),
    ("e10_floatmask.py", ["--n", "6"], None, "api"),
    ("e10_floatmask.py", ["--bug", "peek"], (0, 0, "kv-consistency"), "api"),
    # A StaticCache with a 2-D mask over its whole width read 185 false violations both ways (the
    # query read from the mask's last columns: `hooks`); rows verified one at a time, each on its own
    # cache, and two micro-batches taking turns were followed against the last call, not the last
    # on the same cache (`infer.follow`): 64 false violations, and unreadable from step 2.
    ("e8_arrivals.py", ["--bug", "ghost", "--n", "6"], (12, 4, "kv-consistency"), "command"),
    ("e11_staticcache.py", ["--n", "6"], None, "command"),
    ("e11_staticcache.py", ["--bug", "sharedpos"], (1, 0, "position-contiguity"), "api"),
    ("e12_rightpad.py", ["--n", "6"], None, "command"),
    ("e12_rightpad.py", ["--bug", "padkv"], (1, 0, "kv-consistency"), "command"),
    ("e13_twobatches.py", ["--n", "6"], None, "command"),
    ("e13_twobatches.py", ["--bug", "nocrop", "--n", "6"], (4, 0, "kv-consistency"), "command"),
    ("e14_perrow.py", ["--n", "6"], None, "command"),
    ("e14_perrow.py", ["--bug", "crop1", "--n", "6"], (12, 0, "kv-consistency"), "command"),
    # A slot holding another token's key under a right mask (a realignment rolled one slot too far,
    # a tree's compaction gathering another branch's KV) read unexplained with no violation until
    # the watch compared layer-0 keys (`watch.content`).
    ("e15_roll.py", ["--n", "6"], None, "api"),
    ("e15_roll.py", ["--bug", "shift1"], (2, 0, "kv-consistency"), "command"),
    ("e9_tree4d.py", ["--bug", "gather"], (3, 3, "kv-consistency"), "api"),
    # A system prefix prefilled once and expanded to every row: through the command the prefix was a
    # sequence and each row a newcomer over stale KV, 150 false violations (`infer.follow._new`).
    ("e16_prefix.py", ["--n", "6"], None, "command"),
    ("e16_prefix.py", [], None, "api"),
    # Tries of n-gram candidates over compacted caches: a cache compacted so that its width grew by the
    # whole query block read as KV kept by index (a false `kept_nodes` at step 11: `tree.kept_nodes`).
    ("e17_ngramtree.py", [], None, "api"),
    ("e17_ngramtree.py", ["--bug", "sibling", "--n", "6"], (7, 4, "kv-consistency"), "api"),
    # Rejection sampling through the command: unreadable from its first verify, no violation (the
    # steps before the second non-argmax draft were read as greedy: 20 false violations).
    ("e18_sampled.py", [], "unreadable", "command"),
]
# The command needs the head's class named for the Medusa engine (docs/watch-command.md).
DRAFTER = {"e4_medusa.py": ["--drafter", "MedusaHeads"]}


def _run(engine: str, args: list[str], mode: str, out: Path) -> str:
    """Run the engine (API: `--api out`; command: under `specviz watch --out out`); its stdout."""
    if mode == "api":
        argv = [sys.executable, engine, *args, "--api", str(out)]
    else:
        argv = [sys.executable, "-m", "specviz", "watch", "--out", str(out), *DRAFTER.get(engine, [])]
        argv += ["--", "python", engine, *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run(argv, cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize(("engine", "args", "expected", "mode"), CASES)
def test_a_blind_engine_is_read_right(tmp_path: Path, engine: str, args: list[str], expected, mode: str) -> None:
    out = tmp_path / "run.trace.json"
    printed = _run(engine, args, mode, out)
    report = check_trace(load_trace(out))
    if expected == "unreadable":  # never a violation where it cannot read
        assert report.unreadable is not None and not report.violation_count, report.violations[:3]
        return
    if expected is None:
        assert "MATCH" in printed.split(), "the engine itself is wrong"
        assert report.verdict == "clean" and not report.violation_count, (report.unreadable, report.violations[:3])
        assert report.exact_match == 1.0
        return
    first = report.first_violation
    assert report.verdict != "clean" and first is not None, report.unreadable
    assert (first.step, first.seq_id, first.name) == expected, report.violations[:3]
    # Each draft read is the row's own: no draft field is blamed where the drafts were fed right.
    if engine == "e7_adaptive.py":
        assert not [v for v in report.violations if v.field.startswith("draft_")], report.violations[:3]
