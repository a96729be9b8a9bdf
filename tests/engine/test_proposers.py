"""Every method runs with every proposer, as a chain and as a tree, token-identical to batch-1
greedy decoding of the target (the oracle shares no code with the engine), and `check` finds
nothing wrong in those runs (no false alarm on the schema-3 tree and head fields)."""

from __future__ import annotations

import pytest
from drafting import MANY, decode, oracle, outputs, tiny_pair, with_oracle

from specviz.analysis.check import check_trace
from specviz.engine.proposers import TreeShape, accepted_path
from specviz.engine.proposers.ngram import lookup
from specviz.proposers import REGISTRY, proposer_names

METHODS = ("eqspec", "exspec", "inplace")
PROPOSERS = proposer_names()  # every registered proposer: a new one is tested here with no edit
# A chain from every proposer, a tree from every one that drafts trees.
DRAFTING = [(name, tree) for name in PROPOSERS for tree in (0, 2) if not tree or REGISTRY[name].drafts_trees]
FEW = MANY[:12]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("proposer", "tree"), DRAFTING)
def test_every_method_with_every_proposer_is_exact_and_checks_clean(method: str, proposer: str, tree: int) -> None:
    trace = with_oracle(decode(method, proposer, 5, tree, prompts=FEW), FEW)
    assert outputs(trace) == oracle(tuple(FEW))
    report = check_trace(trace)
    assert report.violation_count == 0, report.violations[:3]
    assert report.verdict == "clean"
    rows = [r for s in trace.steps for r in s.rows]
    assert trace.header.proposer == proposer and trace.header.tree_branches == tree
    if tree:
        assert all(r.tree_parents == list(TreeShape(3, 2).parents) for r in rows)
        assert all(r.kept_nodes == [0, *r.tree_path] for r in rows if not r.finished)
    if proposer == "head":
        assert all(r.head_source is not None for r in rows)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("proposer", "tree"), [("draft-model", 2), ("head", 2), ("head", 0)])
def test_tree_and_head_decoding_are_exact_at_batch_sizes_1_to_32(method: str, proposer: str, tree: int) -> None:
    """Ragged prompts (1 to 90 tokens), batch sizes that split them evenly, unevenly and not at all;
    trees from a draft model and from the head, and the head's chains."""
    expected = oracle()
    for batch in (1, 3, 7, 32):
        assert outputs(decode(method, proposer, batch, tree=tree)) == expected, f"batch {batch}"


def test_tree_paths_use_alternatives_and_stay_ragged() -> None:
    """The test pair must exercise what the tree adds: paths through an alternative, rows of
    different acceptance in one step."""
    trace = decode("eqspec", "draft-model", 8, tree=3)
    paths = [r.tree_path for s in trace.steps for r in s.rows]
    assert any(p and p[-1] > 3 for p in paths), "no accepted path ends on an alternative"
    assert any(len({r.accepted for r in s.rows}) > 1 for s in trace.steps)


def test_accepted_path_is_the_longest_agreeing_chain() -> None:
    tree = TreeShape(k=3, branches=2)  # nodes: 0 root, 1-2-3 main chain, 4 (parent 0), 5 (parent 1)
    assert tree.parents == (-1, 0, 1, 2, 0, 1) and tree.depths == (0, 1, 2, 3, 1, 2)
    nodes = [9, 10, 11, 12, 20, 21]
    # The target agrees with node 1, then picks 21 (node 5, the alternative at depth 2).
    targets = [10, 21, 0, 0, 0, 7]
    assert accepted_path(tree, nodes, targets) == [1, 5]
    assert accepted_path(tree, nodes, [20, 0, 0, 0, 0, 0]) == [4]
    assert accepted_path(tree, nodes, [5, 0, 0, 0, 0, 0]) == []
    ancestors = tree.ancestors()
    assert ancestors[5].nonzero().flatten().tolist() == [0, 1, 5]


def test_ngram_lookup_copies_what_followed_the_latest_match() -> None:
    assert lookup([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2) == [[7, 1], [9, 1]]
    assert lookup([5, 6, 7], 2) == []


def test_a_head_that_does_not_fit_the_target_is_refused_in_one_line(tmp_path) -> None:
    from specviz.engine.proposers import EagleHead, load_head
    from specviz.errors import ModelLoadError

    pair = tiny_pair()
    EagleHead(hidden=7, embed=7, inner=4).save(tmp_path)
    with pytest.raises(ModelLoadError, match="head made for hidden 7"):
        load_head(tmp_path, pair.target)
    with pytest.raises(ModelLoadError, match="cannot load draft head"):
        load_head(tmp_path / "missing", pair.target)


def test_bench_arms_cover_chain_tree_head_and_draft_for_every_method() -> None:
    from specviz.bench.settings import DRAFTING_ARMS, BenchSettings, resolve_arm

    settings = BenchSettings(arms=("baseline", *DRAFTING_ARMS))
    settings.validate()
    configs = {name: resolve_arm(name).config(8, 4, settings) for name in DRAFTING_ARMS}
    assert {(c.method, c.proposer, c.tree_branches) for c in configs.values()} == {
        (m, p, t) for m in METHODS for p in ("draft-model", "head") for t in (0, 2)
    }
    for config in configs.values():
        config.validate()


def test_default_head_ships_beside_the_default_pair_small_and_drafting() -> None:
    """The embedded head (tools/train_default_models.py --head) fits the default target, is small,
    and drafts well enough to be worth it: above a third of its drafts accepted on held-out prompts."""
    from pathlib import Path

    from specviz.data import load_specbench
    from specviz.engine.config import RunConfig
    from specviz.engine.models import DEFAULT_HEAD, load_pair
    from specviz.engine.run import run

    assert sum(f.stat().st_size for f in Path(DEFAULT_HEAD).iterdir()) < 2_000_000
    pair = load_pair(device="cpu")
    config = RunConfig(method="eqspec", batch_size=4, draft_k=4, max_new_tokens=24, proposer="head")
    trace = run(pair, load_specbench("heldout")[:4], config)
    assert all(s.output_ids == s.reference_ids for s in trace.sequences)
    rows = [r for s in trace.steps for r in s.rows]
    assert sum(r.accepted for r in rows) > len(rows) * 4 / 3


@pytest.mark.parametrize("proposer", ["draft-model", "ngram"])
def test_inplace_tree_blocks_fit_their_regions_up_to_the_last_token(proposer: str) -> None:
    """A row one token short of its budget still writes a whole tree block (k + 1 + branches slots)."""
    prompts = FEW[:6]
    for max_new in range(1, 10):
        trace = decode("inplace", proposer, 3, tree=3, prompts=prompts, max_new_tokens=max_new)
        assert outputs(trace) == oracle(tuple(prompts), max_new), f"max_new_tokens {max_new}"


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_coupled_sampling_stays_token_exact_with_every_proposer(proposer: str) -> None:
    """At temperature > 0 the target's keyed samples decide; any proposer only moves acceptance."""
    from specviz.engine.config import RunConfig
    from specviz.engine.run import run

    config = RunConfig(
        method="exspec", batch_size=3, draft_k=3, max_new_tokens=8, temperature=0.8, seed=3, proposer=proposer
    )
    report = check_trace(run(tiny_pair(), FEW[:8], config))
    assert report.verdict == "clean" and report.exact_match == 1.0


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "opt", "qwen3"])
def test_tree_is_exact_on_other_families(family: str) -> None:
    """The 4-D tree mask reaches every attention implementation: biases, partial rotary, learned
    positions, query/key norms."""
    from exactness import PROMPTS, pair_for

    from specviz.engine.config import RunConfig
    from specviz.engine.reference import greedy_reference
    from specviz.engine.run import run

    pair, prompts = pair_for(family), PROMPTS[:8]
    expected = [
        greedy_reference(pair.target, pair.tokenizer(p)["input_ids"], 8, frozenset([1]), pair.device)[0]
        for p in prompts
    ]  # noqa: E501
    for method in ("eqspec", "inplace"):
        config = RunConfig(method=method, batch_size=3, draft_k=3, max_new_tokens=8, tree_branches=2, reference=False)
        assert [s.output_ids for s in run(pair, prompts, config).sequences] == expected, method


def test_head_runs_leave_no_hook_on_a_kept_target() -> None:
    """A pair kept across runs (the app caches its pairs) collects no LM-head hooks, nor taps that
    hold their last hidden states: each capture removes its hook."""
    lm_head = tiny_pair().target.get_output_embeddings()
    before = len(lm_head._forward_pre_hooks)
    for _ in range(2):
        assert outputs(decode("eqspec", "head", 2, prompts=FEW[:2])) == oracle(tuple(FEW[:2]))
    assert len(lm_head._forward_pre_hooks) == before


@pytest.mark.parametrize("proposer", ["head", "ngram"])
def test_runs_without_a_draft_model_note_no_draft_model_check(proposer: str) -> None:
    """Head and n-gram runs record no draft-model calls (there are none): `check` says nothing
    about the draft position and attended-width checks, which cannot apply, and flags nothing."""
    report = check_trace(with_oracle(decode("exspec", proposer, 3, prompts=FEW[:4]), FEW[:4]))
    assert report.verdict == "clean"
    assert not [s for s in report.skipped_checks if "draft" in s.check], report.skipped_checks
