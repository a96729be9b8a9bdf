"""A tree-verifying engine written without specviz (`tests/watch/zoo/tree.py`: top-2 branches
from a cacheless draft, level-order nodes, one padded [B, N] verify with a 4-D tree mask, trees
ragged near each row's budget, KV kept by index or compacted), watched through the API with its
trees declared (`w.batch(seq_ids, parents=...)`), with only its rows declared (`w.rows`: the trees
are read from the mask), and through the command.

The truth is independent of specviz: the correct engine equals batch-1 greedy of the target on
every prompt, each to its own budget (`shapes.reference`, unwatched). Then:
(a) the correct run checks clean (0 violations, exact match 1.0), its rows carrying the schema-3
    tree fields, so `analysis.tree_checks` judged it;
(b) each injected bug's first violation is at the (step, sequence) the engine reports, with the
    invariant it breaks as that mode can read it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from own_watched import run_watched_engine
from tiny import make_pair
from zoo import shapes, tree
from zoo.command import assert_command_read, watch_script

import specviz
from specviz.analysis.check import check_trace
from specviz.trace.invariants import Invariant
from specviz.watch import WatchError
from specviz.watch.tree import parents_of_block
from specviz.watch.view import read_views

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21], [30, 31, 32, 33, 34]]
BUDGETS = [10, 4, 10, 7, 9]
# How the run is watched: its trees declared (`w.batch(..., parents=...)`), its rows only (trees
# from the mask), or through the command; "compact-": the engine compacts the kept KV instead of
# keeping it by index (`kept_nodes` is then not read: a stale branch shows at the next step).
# "idle-": finished rows stay in the batch, fed pads whose query block is masked out but that
# still see their cache (read as feeding nothing: a real token attends its own key).
MODES = ["declared", "rows", "command", "compact-declared", "compact-command", "idle-rows", "idle-command"]
BUGS = {
    # declared trees: the sibling a node sees is no ancestor (KV). Read from the mask, the row's
    # block is causal, read as a chain-shaped tree whose depths the positions do not follow.
    ("sibling", "declared"): Invariant.KV,
    ("sibling", "rows"): Invariant.POSITIONS,
    ("positions", "declared"): Invariant.POSITIONS,
    ("positions", "rows"): Invariant.POSITIONS,
    ("stale_branch", "declared"): Invariant.KV,
    ("stale_branch", "rows"): Invariant.KV,
    ("off_path", "declared"): Invariant.ACCOUNTING,
    ("off_path", "rows"): Invariant.ACCOUNTING,
}
WRONG_OUTPUT = "off_path"  # the target's choice not kept: a wrong output, never called clean
BUGS.update({(bug, "command"): invariant for (bug, mode), invariant in list(BUGS.items()) if mode == "rows"})
BUGS.update({(bug, f"compact-{mode}"): BUGS[bug, mode] for bug, mode in list(BUGS) if mode != "rows"})
BUGS.update({(bug, f"idle-{mode}"): BUGS[bug, mode] for bug, mode in list(BUGS) if mode in ("rows", "command")})


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


@pytest.fixture(scope="module")
def runs(pair, tmp_path_factory):
    done: dict[tuple, tuple] = {}
    tmp = tmp_path_factory.mktemp("tree")

    def get(bug: str | None, mode: str):
        if (bug, mode) not in done:
            compact, idle = int(mode.startswith("compact-")), int(mode.startswith("idle-"))
            command = mode.endswith("command")
            done[bug, mode] = _command(tmp, bug, compact, idle) if command else _api(pair, bug, mode, compact, idle)
        return done[bug, mode]

    return get


def _api(pair, bug: str | None, mode: str, compact: int, idle: int = 0):
    declare = int(mode.endswith("declared"))
    with specviz.watch(pair.target, pair.draft, prompts=PROMPTS, name=f"tree-{mode}") as w:
        outs, events = tree.generate(
            pair.target, pair.draft, PROMPTS, BUDGETS, bug=bug, w=w, declare=declare, compact=compact, idle=idle
        )
    return w.trace, outs, events


def _command(tmp: Path, bug: str | None, compact: int, idle: int = 0):
    options = {"compact": compact, **({"idle": idle} if idle else {})}
    return watch_script(tmp / f"tree-{bug}-{compact}-{idle}.trace.json", "tree", PROMPTS, BUDGETS, bug, options)


def test_the_engine_is_a_correct_tree_engine(pair) -> None:
    """Without specviz: batch-1 greedy on every prompt, each to its own budget; steps that keep
    the whole depth and steps that keep nothing."""
    steps: list[list[int]] = []

    class Recorder:
        def rows(self, seq_ids, model=None) -> None:
            pass

        def emit(self, seq, tokens, finish_reason=None) -> None:
            steps.append(list(tokens))

    outs, events = tree.generate(pair.target, pair.draft, PROMPTS, BUDGETS, w=Recorder())
    assert outs == shapes.reference(pair.target, PROMPTS, BUDGETS) and not events
    assert {1, 4} <= {len(tokens) for tokens in steps}  # nothing accepted; the full depth 3 plus the bonus


@pytest.mark.parametrize("mode", MODES)
def test_correct_tree_engine_checks_clean(pair, runs, mode: str) -> None:
    trace, outs, _ = runs(None, mode)
    assert outs == shapes.reference(pair.target, PROMPTS, BUDGETS)
    report = check_trace(trace)
    assert report.verdict == "clean", (report.verdict, report.violations[:3])
    assert not report.violation_count and report.exact_match == 1.0
    rows = [row for step in trace.steps for row in step.rows]
    shapes_read = {tuple(tree.tree_parents(d)) for d in (1, 2, 3)}  # trees shrink near a row's budget
    assert all(tuple(row.tree_parents) in shapes_read for row in rows)  # every row read as its tree
    assert any(len({len(row.tree_parents) for row in step.rows}) > 1 for step in trace.steps)  # ragged
    assert all(row.node_attends is not None and row.tree_path is not None for row in rows)
    if mode.startswith("compact-"):  # which node a compacted slot came from is not in the mask
        assert all(row.kept_nodes is None for row in rows)
    else:  # read from the next step's mask
        assert any(row.kept_nodes == [0, *row.tree_path] for row in rows)
    assert any(row.tree_path[:1] == [2] for row in rows)  # the second branch accepted: a tree, not a chain
    assert trace.header.tree_branches == 3


@pytest.mark.parametrize(("bug", "mode"), list(BUGS))
def test_injected_tree_bug_is_located(runs, bug: str, mode: str) -> None:
    trace, _, events = runs(bug, mode)
    assert events, f"{bug} never fired"
    report = check_trace(trace)
    v = report.first_violation
    assert v is not None, (report.verdict, report.skipped_checks)
    assert (v.step, v.seq_id, v.invariant) == (*events[0], BUGS[bug, mode]), report.violations[:3]


def test_parents_read_from_a_query_block() -> None:
    """Node i attends itself and its parent's view: a tree; anything else is not read as one."""
    on, off = True, False
    branching = [[on, off, off], [on, on, off], [on, off, on]]  # nodes 1 and 2 both children of 0
    assert parents_of_block(branching) == [-1, 0, 0]
    assert parents_of_block([[on, off, off], [on, on, off], [on, on, on]]) == [-1, 0, 1]  # a chain
    assert parents_of_block([[on, off], [off, on]]) is None  # two roots: two sequences packed
    assert parents_of_block([[on, off, off], [on, on, off], [off, on, on]]) is None  # sees 1, not its root


class Redeclared:
    """What the tree engine declares, passed on to the watch with its trees replaced by
    `parents_of(parents)`: a declaration that disagrees with what the engine feeds."""

    def __init__(self, w, parents_of) -> None:
        self.w, self.parents_of = w, parents_of

    def rows(self, seq_ids, model=None) -> None:
        self.w.rows(seq_ids)

    def batch(self, seq_ids, parents=None) -> None:
        self.w.batch(seq_ids, parents=self.parents_of(parents))

    def emit(self, *args) -> None:
        self.w.emit(*args)


def test_declared_trees_are_checked(pair) -> None:
    """A malformed tree is refused in one line; a tree with more nodes than the row's query makes
    the run unreadable, never a verdict on what was not read."""
    with specviz.watch(pair.target, pair.draft, prompts=PROMPTS) as w:
        for bad in ([[0, 0]] * 5, [[-1, 1]] * 5, [[-1, 0]] * 4, [[-1, 0.5]] * 5, [3] * 5):
            with pytest.raises(WatchError, match="batch: "):
                w.batch(range(5), parents=bad)
        with pytest.raises(WatchError, match="not the draft's"):  # the draft verifies no tree
            w.batch(range(5), parents=[[-1, 0, 0]] * 5, model="draft")
        with pytest.raises(WatchError, match="5 trees"):  # one tree per packed segment too
            w.batch(range(5), parents=[[-1, 0, 0]] * 4, query_lens=[3] * 5)

        too_big = Redeclared(w, lambda parents: [tree.tree_parents(4)] * len(parents))  # 9 nodes for 7
        tree.generate(pair.target, pair.draft, PROMPTS, BUDGETS, w=too_big, declare=1)
    report = check_trace(w.trace)
    assert report.verdict == "unreadable"
    assert "declares a tree of 9 nodes" in w.trace.header.options["watch_unreadable"]["why"]


def test_a_declared_tree_past_its_row_s_padding_is_unreadable(pair) -> None:
    """Near their budgets the rows verify ragged trees, right-padded to the widest one. Declared as
    the widest tree for every row, a padded row's tree has more nodes than its real query tokens
    though no more than the call's query: its nodes are not in the call, so the run is unreadable
    (`_declared_trees` counts the row's live run, not the query's width), never a crash."""
    with specviz.watch(pair.target, pair.draft, prompts=PROMPTS) as w:
        widest = Redeclared(w, lambda parents: [max(parents, key=len)] * len(parents))  # every row the widest
        tree.generate(pair.target, pair.draft, PROMPTS, BUDGETS, w=widest, declare=1)
    report = check_trace(w.trace)
    assert report.verdict == "unreadable"
    assert "declares a tree of 7 nodes; its query holds 5 tokens" in w.trace.header.options["watch_unreadable"]["why"]


@pytest.mark.parametrize("declare", [0, 1])
def test_one_row_tree_is_not_read_as_packed_sequences(pair, declare: int) -> None:
    """A batch of one is a 1 x N call: its tree mask drops a sibling's slot as a packed mask drops
    a neighbour's, yet it is one row's tree (declared, or read with its positions), checked clean."""
    prompts = PROMPTS[:1]
    with specviz.watch(pair.target, pair.draft, prompts=prompts) as w:
        outs, _ = tree.generate(pair.target, pair.draft, prompts, 8, w=w, declare=declare)
    report = check_trace(w.trace)
    assert outs == shapes.reference(pair.target, prompts, 8)
    assert report.verdict == "clean" and report.exact_match == 1.0, report.violations[:3]
    assert all(row.tree_parents for step in w.trace.steps for row in step.rows)


@pytest.mark.parametrize("mode", MODES)
def test_wrong_output_is_never_clean(pair, runs, mode: str) -> None:
    trace, outs, events = runs(WRONG_OUTPUT, mode)
    assert events and outs != shapes.reference(pair.target, PROMPTS, BUDGETS)
    report = check_trace(trace)
    assert report.verdict != "clean" and report.exact_match < 1.0


TREE_FIELDS = ("tree_parents", "tree_depths", "node_attends", "tree_path", "accepted", "bonus", "position_ids")
TREE_FIELDS += ("kv_len",)


@pytest.mark.parametrize("method", ["eqspec", "inplace"])
def test_own_tree_engine_watched_reads_what_its_recorder_writes(pair, method: str) -> None:
    """specviz's own tree engine (a static tree: a chain plus one alternative at each of the first
    depths; INPLACE's mask keys are its in-place cache's slots), watched with its rows declared
    only: every tree read from the mask, each row's tree fields as the recorder wrote them (the
    recorder's `kept_nodes` aside: these engines move the kept KV, which the mask does not show)."""
    from specviz.engine import run as run_module
    from specviz.engine.run import RunConfig

    texts = ["abcdef", "xyz", "hello world", "q", "tree tree"]

    def config(record: bool) -> RunConfig:
        config = RunConfig(method=method, batch_size=4, draft_k=3, max_new_tokens=8, tree_branches=2)
        config.reference, config.record_steps = False, record
        return config

    w = specviz.watch(pair.target, pair.draft, tokenizer=pair.tokenizer, prompts=texts)
    run_watched_engine(pair, texts, config(False), w)
    watched = w.close()
    recorded = run_module.run(pair, texts, config(True))
    report = check_trace(watched)
    assert report.verdict == "clean" and report.exact_match == 1.0, report.violations[:3]
    rows = {(si, r.seq_id): r for si, step in enumerate(recorded.steps) for r in step.rows}
    seen = {(si, r.seq_id): r for si, step in enumerate(watched.steps) for r in step.rows}
    assert seen.keys() == rows.keys()
    for key, row in rows.items():
        assert row.tree_parents is not None
        assert [getattr(seen[key], f) for f in TREE_FIELDS] == [getattr(row, f) for f in TREE_FIELDS], key


def _tree_call(cache_width: int, ids: list[int], positions: list[int], block: list[list[int]]):
    """One materialized target row with a [cache | query] 4-D mask: every cache slot, then `block`."""
    from specviz.watch.hooks import CallRecord

    mask = [[[True] * cache_width + [bool(v) for v in line] for line in block]]
    call = CallRecord("target", None, [ids], [positions], True, cache_width, "4d", mask, 1, len(ids))
    call.last_slots = [len(ids) - 1]
    call.views = read_views(call)  # as `materialize` reads them
    return call


def test_a_tree_after_refed_context_is_unreadable_not_guessed() -> None:
    """A cacheless row re-feeds its context before its tree: the mask shows one chain from the
    first token, so where the pending token sits is unknown. Unreadable, not read as a tree from
    the prompt's first token (which would flag every position); with a cache it is read."""
    from specviz.watch.tree import read_trees

    chain_then_fork = [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]]
    refed = _tree_call(0, [5, 6, 7, 8, 9], [0, 1, 2, 3, 3], chain_then_fork)
    read_trees(refed)
    assert not any(refed.trees) and "re-feeds" in refed.unreadable
    fork_at_two = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1]]  # the root sees its cache
    cached = _tree_call(2, [7, 8, 9, 4], [2, 3, 4, 4], fork_at_two)
    read_trees(cached)
    assert cached.trees == [[-1, 0, 1, 1]] and cached.unreadable is None


def test_what_a_tree_step_kept_is_read_from_the_next_call_never_guessed() -> None:
    """The command's reading of a tree step's tokens (`infer.gains.step_gain`): the nodes the next call
    still attends (KV kept by index), else the path whose end the target chose the fed token
    after; two paths alike in that, the greedy one (the root's choice); nothing to tell them apart:
    unreadable."""
    from specviz.watch.calls import RowQuery
    from specviz.watch.infer.gains import step_gain
    from specviz.watch.tree import read_trees

    def step_call(targets: list[int]):  # pending 7, children 8 and 9, after 2 cached slots
        call = _tree_call(2, [7, 8, 9], [2, 3, 3], [[1, 0, 0], [1, 1, 0], [1, 0, 1]])
        read_trees(call)
        call.argmax = [targets]
        return call

    def gain(targets, later, grown):
        calls = [step_call(targets), later]
        return step_gain(calls, (0, 0), (1, 0), RowQuery(0, 2, ()), RowQuery(0, 0, ()), [5, 6, 7], grown)

    kept_by_index = _with_view(5, [0, 1, 2, 4], 40)  # the root and node 2 still attended
    assert gain([8, 40, 40], kept_by_index, 2) == [9, 40]
    compacted = _with_view(4, [0, 1, 2, 3], 40)  # two slots kept: which nodes, the mask does not say
    assert gain([8, 40, 41], compacted, 2) == [8, 40]  # only node 1's choice is the token fed
    assert gain([8, 40, 40], compacted, 2) == [8, 40]  # both are: greedy acceptance (the root chose 8)
    assert isinstance(gain([5, 40, 40], compacted, 2), str)  # the root chose neither: unreadable


def _with_view(width: int, seen: list[int], token: int):
    """A one-token target call after `width` cache slots whose pending token attends `seen` and itself."""
    call = _tree_call(width, [token], [4], [[1]])
    call.mask = [[[j in seen for j in range(width)] + [True]]]
    call.views = read_views(call)
    return call


# A draft head proposing the trees (`tree.generate(..., head=1)`: top 2 at depth 1 from the
# target's hidden state, each branch greedy), padded, rows leaving, every prompt of one length:
# through the command (the head undeclared), as an outside tester ran it. ("off_path" is left out:
# here it fires at its sequence's last step, whose tokens no later call shows, so the command reads
# them as a greedy engine's, a limit of docs/watch-command.md: that run reads CLEAN.)
EQUAL = [[91, 86, 70, 6], [62, 34, 86, 9], [23, 17, 50, 63], [34, 51, 72, 16]]
EQUAL_BUDGETS = [6, 3, 6, 9]


@pytest.mark.parametrize("bug", [None, "sibling", "positions", "stale_branch"])
@pytest.mark.parametrize("idle", [0, 1])
def test_tree_head_with_equal_prompt_lengths_through_the_command(tmp_path: Path, pair, idle: int, bug) -> None:
    options = {"head": 1, "idle": idle}
    trace, outs, events = watch_script(tmp_path / "tree-head.trace.json", "tree", EQUAL, EQUAL_BUDGETS, bug, options)
    reference = shapes.reference(pair.target, EQUAL, EQUAL_BUDGETS)
    assert_command_read(trace, outs, events, reference, BUGS[bug, "command"] if bug else None)


def test_a_wrong_token_at_a_last_step_reads_clean_only_as_read(tmp_path: Path, pair) -> None:
    """off_path at sequence 2's last step, in a script that decodes nothing: no later call shows
    what that step kept, nor does a decoded output (test_decoded_outputs.py), so the command reads
    it as the target's choices and the run reads clean (docs/watch.md, "Read, not seen"). It is
    never a silent clean: the trace counts the tokens read so, and the report says it."""
    from specviz.analysis.text import render_report

    trace, outs, events = watch_script(
        tmp_path / "off.trace.json", "tree", EQUAL, EQUAL_BUDGETS, "off_path", {"head": 1}
    )
    assert events and outs != shapes.reference(pair.target, EQUAL, EQUAL_BUDGETS)  # a wrong output
    report = check_trace(trace)
    read = report.read_as_greedy
    assert read is not None and read["sequences"] == len(EQUAL) and read["tokens"] >= len(EQUAL)
    assert report.to_dict()["read_as_greedy"] == read
    if report.verdict == "clean":
        assert "read its tokens as the target's choices" in render_report(trace, report)
