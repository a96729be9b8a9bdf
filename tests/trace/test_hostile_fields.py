"""Every hostile value of a tree, mask or cache field is a violation or a one-line refusal, never an
exception (issue 43, attack 6: `node_attends` one entry longer than `tree_parents` was flagged by
the check, then the tree picture indexed past its end: "unexpected error: IndexError").

The fuzz starts from a tree run and a chain run, sets one or more of a row's tree, mask and cache
fields (and the step's widths) to a hostile value (off by one, negative, huge, empty, nested
wrong, a cycle, a self-parent) and loads, checks and draws what the app would: the grid of every
row of that step, its tree, the details panel, the keys, the report and the Perfetto export. A
`TraceError` (the loader's one-line refusal) is an answer; anything else escaping is the bug."""

from __future__ import annotations

import copy
import gzip
import io
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specviz.app.loading import TRACES
from specviz.app.share import cell_details, key_target
from specviz.trace.budget import PUBLIC_BUDGET
from specviz.trace.io import trace_from_dict
from specviz.trace.validate import TraceError
from specviz.views import analyse, grid_view
from specviz.views.perfetto import write_perfetto
from specviz.views.report import report_html


def _small(name: str, steps: int = 3) -> dict[str, Any]:
    data = json.loads(gzip.decompress((TRACES / name).read_bytes()))
    data["steps"] = data["steps"][:steps]
    data["header"].pop("token_text", None)  # the steps cut: IDs the table names would go unused
    return data


BASES = {"tree": _small("default-eqspec-tree2.json.gz"), "chain": _small("default-eqspec-stale-kv.json.gz")}
ROW_LISTS = ("tree_parents", "tree_depths", "tree_path", "kept_nodes", "head_source", "position_ids")
ROW_LISTS += ("draft_tokens", "target_tokens", "emitted", "draft_position_ids", "draft_kv_lens")
ROW_INTS = ("committed_before", "left_pad", "left_pad_after", "kv_len", "kv_len_expected", "accepted")
ROW_INTS += ("kv_mismatch_slot", "draft_kv_len", "draft_kv_len_expected", "pending_token", "bonus", "row", "write_seq")
STEP_INTS = ("cache_len", "query_len")
INTS = st.one_of(
    st.sampled_from([-1, 0, 1, 2, 255, 256, 257, 2**31, -(2**31), 10**7, 10**10]), st.integers(-3, 300)
)  # fmt: skip


def hostile_list(original: Any) -> st.SearchStrategy:
    items = original if isinstance(original, list) else []
    return st.one_of(
        st.just([]),
        st.just(None),
        st.just([*items, items[-1] if items else 0]),  # one entry too many
        st.just(items[:-1]),  # one too few
        st.just([-1] * max(len(items), 1)),  # every node the root: a forest
        st.just(list(range(len(items)))),  # each node its own parent
        st.just([[0]] * max(len(items), 1)),  # nested where flat is read
        st.lists(INTS, max_size=12),
    )


def hostile_attends(original: Any) -> st.SearchStrategy:
    items = original if isinstance(original, list) else []
    return st.one_of(
        st.just([*items, [0]]),  # issue 43's attack: one set more than there are nodes
        st.just(items[:-1]),
        st.just([[]] * len(items)),
        st.just([[n, 10**6] for n in range(len(items))]),  # a node far out of the tree
        st.just([[-1]] * len(items)),
        st.just([0] * len(items)),  # flat where nested is read
        st.lists(st.lists(INTS, max_size=4), max_size=12),
    )


def hostile_mask(original: Any) -> st.SearchStrategy:
    return st.one_of(
        st.just([]),
        st.just([[1, 10**7]]),
        st.just([[1, 2**31]]),
        st.just([[2, 1]]),
        st.just([[1]]),
        st.just([[1, -1]]),
        st.just([*(original or []), [1, 5]]),  # longer than the row
        st.lists(st.tuples(st.integers(0, 1), INTS).map(list), max_size=6),
    )


@st.composite
def mutations(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """A run with hostile values, and the (step index, row) places they were put."""
    data = copy.deepcopy(BASES[draw(st.sampled_from(sorted(BASES)))])
    places = []
    for _ in range(draw(st.integers(1, 3))):
        index = draw(st.integers(0, len(data["steps"]) - 1))
        step = data["steps"][index]
        row = draw(st.sampled_from(step["rows"]))
        places.append((index, row["row"]))
        field = draw(st.sampled_from((*ROW_LISTS, *ROW_INTS, *STEP_INTS, "node_attends", "mask_rle")))
        if field in STEP_INTS:
            step[field] = draw(INTS)
        elif field in ROW_INTS:
            row[field] = draw(st.one_of(INTS, st.none()))
        elif field == "node_attends":
            row[field] = draw(hostile_attends(row.get(field)))
        elif field == "mask_rle":
            row[field] = draw(hostile_mask(row.get(field)))
        else:
            row[field] = draw(hostile_list(row.get(field)))
    return data, places


def everything_drawn(data: dict[str, Any], places: list[tuple[int, Any]] | None = None) -> str:
    """Load, check and draw: the grid, tree and details panel at each place (default: every row of
    every step), the keys from there, the report and the Perfetto export."""
    try:
        trace = trace_from_dict(data, PUBLIC_BUDGET)
    except TraceError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < 600  # one line
        return "refused"
    loaded = analyse(trace, "upload hostile.json")
    if places is None:
        places = [(index, row.row) for index, step in enumerate(trace.steps) for row in step.rows]
    for index, row in places:
        view = grid_view(loaded, index, row, 40)  # a row the step lacks (a hostile `row`): none highlighted
        assert view.figure is not None
        cell_details(loaded, index, row, None)
        for key in ("j", "k", "n", "N", ".", ","):
            key_target(loaded, key, index, row)
    report_html(loaded, "hostile.json")
    write_perfetto(trace, loaded.report, io.StringIO())
    return loaded.report.verdict


def test_node_attends_one_longer_than_the_tree_is_flagged_and_drawn() -> None:
    data = copy.deepcopy(BASES["tree"])
    index, row = next((i, r) for i, s in enumerate(data["steps"]) for r in s["rows"] if r.get("node_attends"))
    row["node_attends"].append([0])
    assert everything_drawn(data, [(index, row["row"])]) == "desync"


@given(mutations())
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_no_hostile_tree_mask_or_cache_field_raises(case: tuple[dict[str, Any], list[tuple[int, int]]]) -> None:
    data, places = case
    assert everything_drawn(data, places) in ("refused", "clean", "numerical", "unexplained", "desync", "unreadable")
