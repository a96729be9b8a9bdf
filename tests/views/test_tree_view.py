"""The tree picture: per row its candidate tree, the accepted path green, the first broken node
dark red (decided by `analysis.tree_checks.first_broken_node`), and the grid view carries it only
for tree steps."""

from __future__ import annotations

from drafting import MANY, decode

from specviz.analysis.tree_checks import first_broken_node
from specviz.views.run import analyse, grid_view
from specviz.views.tree import BROKEN, MAX_ROWS, PATH, tree_figure

PROMPTS = MANY[:6]


def _markers(fig):
    return [t for t in fig.data if t.mode == "markers+text"]


def test_tree_figure_marks_the_accepted_path_and_no_broken_node_on_a_correct_run() -> None:
    trace = decode("eqspec", "draft-model", 6, tree=2, prompts=PROMPTS)
    step = trace.steps[0]
    fig = tree_figure(step, {})
    markers = _markers(fig)
    assert len(markers) == len(step.rows)
    for row, trace_markers in zip(step.rows, markers):
        colors = list(trace_markers.marker.color)
        assert colors[0] == PATH and all(colors[n] == PATH for n in row.tree_path)
        assert BROKEN not in colors
        assert first_broken_node(row) is None


def test_first_broken_node_is_dark_red_under_a_sibling_mask() -> None:
    trace = decode("eqspec", "draft-model", 6, tree=2, prompts=PROMPTS, fault="tree-sibling-mask")
    row = trace.steps[0].rows[0]
    broken = first_broken_node(row)
    assert broken == 4  # the first alternative: it saw the main chain, not only the root
    colors = list(_markers(tree_figure(trace.steps[0], {}))[0].marker.color)
    assert colors[broken] == BROKEN and colors.count(BROKEN) == 1


def test_grid_view_carries_a_tree_only_for_tree_steps_and_bounds_the_rows() -> None:
    tree_run = analyse(decode("exspec", "ngram", 16, tree=1, prompts=MANY[:16]), "tree")
    view = grid_view(tree_run, 0, None, None)
    assert view.tree is not None and len(_markers(view.tree)) == min(MAX_ROWS, len(tree_run.trace.steps[0].rows))
    chain_run = analyse(decode("eqspec", "draft-model", 4, prompts=PROMPTS), "chain")
    assert grid_view(chain_run, 0, None, None).tree is None
