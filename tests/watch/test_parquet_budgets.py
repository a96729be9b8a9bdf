"""A watched run with a budget per request (`header.options.sequence_budgets`), converted to
Parquet, checks exactly like its JSON: the columnar walk (`specviz.analysis.columnar`) reads each
sequence's own budget, as the row-by-row walk does, never the run's largest.

The engine is the zoo's packed one (`tests/watch/zoo/packed.py`, written without specviz): each
prompt has its own `max_new_tokens`, so rows end early by "length". The oracle is twofold: the
engine's outputs against batch-1 greedy of the target to each budget (`shapes.reference`, no
hooks), and the JSON walk's report of the same trace. Row groups of a few rows put sequences'
endings in the middle of a group, where a shared budget would misjudge them.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from tiny import make_pair
from zoo import packed, shapes

import specviz
from specviz.analysis.check import check_trace
from specviz.analysis.findings import BUDGETS
from specviz.trace.columnar import ParquetTraceWriter
from specviz.trace.invariants import Invariant
from specviz.trace.io import open_trace, parse_trace_bytes, trace_to_json
from specviz.trace.schema import Trace

# test_zoo_production's prompts and budgets, where each bug's first violation is at its step.
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17], [20, 21], [30, 31, 32, 33, 34]]
OWN_BUDGETS = [10, 4, 10, 7, 9]  # the header's max_new_tokens is 10; three end before it
GROUP_ROWS = [2, 3, 64]  # row groups cut inside steps, between them, and one group for all


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


@pytest.fixture(scope="module")
def runs(pair) -> dict[str | None, tuple[Trace, list[list[int]], list[tuple[int, int]]]]:
    """The packed engine watched through the API: correct, and with two injected bugs."""
    done = {}
    for bug in (None, "kv_leak", "stale_kv"):
        with specviz.watch(pair.target, pair.draft, prompts=PROMPTS) as w:
            outs, events = packed.generate(pair.target, pair.draft, PROMPTS, OWN_BUDGETS, bug=bug, w=w)
        done[bug] = (w.trace, outs, [tuple(e) for e in events])
    return done


def _as_json(trace: Trace) -> Trace:
    """The trace as its JSON file reads back (the row-by-row walk's input)."""
    return parse_trace_bytes(trace_to_json(trace).encode(), "watched")


def _as_parquet(trace: Trace, path: Path, rows: int) -> Trace:
    writer = ParquetTraceWriter(path, row_group_rows=rows)
    for step in trace.steps:
        writer.add_step(step)
    return open_trace(writer.close(trace.header, trace.sequences))


def _both(trace: Trace, tmp_path: Path, rows: int) -> tuple[dict, dict]:
    json_trace = _as_json(trace)
    json_trace.steps = [step for step in json_trace.steps if step.rows]  # Parquet stores no empty step
    columnar = _as_parquet(json_trace, tmp_path / "t.parquet", rows)
    return check_trace(json_trace).to_dict(), check_trace(columnar).to_dict()


@pytest.mark.parametrize("rows", GROUP_ROWS)
def test_correct_run_with_own_budgets_is_clean_from_parquet(pair, runs, tmp_path: Path, rows: int) -> None:
    trace, outs, _ = runs[None]
    assert outs == shapes.reference(pair.target, PROMPTS, OWN_BUDGETS)  # the engine is right
    assert trace.header.max_new_tokens == 10 and trace.header.options[BUDGETS] == {"1": 4, "3": 7, "4": 9}
    from_json, from_parquet = _both(trace, tmp_path, rows)
    assert from_json["verdict"] == "clean" and from_json["violation_count"] == 0
    assert from_parquet == from_json


@pytest.mark.parametrize("rows", GROUP_ROWS)
@pytest.mark.parametrize("bug", ["kv_leak", "stale_kv"])
def test_bug_with_own_budgets_has_the_same_first_violation(runs, tmp_path: Path, bug: str, rows: int) -> None:
    trace, _, events = runs[bug]
    step, prompt = events[0]  # the engine's own log: the step and the prompt the bug first hit
    seq_id = next(s.seq_id for s in trace.sequences if s.prompt_ids == PROMPTS[prompt])
    from_json, from_parquet = _both(trace, tmp_path, rows)
    first = from_json["first_violation"]
    assert (first["step"], first["seq_id"], first["invariant"]) == (step, seq_id, int(Invariant.KV))
    assert from_parquet == from_json


@pytest.mark.parametrize("rows", GROUP_ROWS)
@pytest.mark.parametrize("endings", ["recorded", "stripped"])
@pytest.mark.parametrize(("seq_id", "declared"), [(1, 1), (1, 2), (1, 3), (3, 4), (4, 8)])
def test_an_engine_past_a_declared_budget_is_flagged_the_same(
    runs, tmp_path: Path, seq_id: int, declared: int, endings: str, rows: int
) -> None:
    """An engine that ignores a request's own `max_new_tokens`: the correct run's rows, with that
    sequence's budget declared shorter than what it decoded (4 -> 1, 2, 3; 7 -> 4; 9 -> 8), so a
    row writes past it, and with or without the rows' `finished`/`finish_reason` (without them,
    only the accounting can see it). The JSON walk flags it; so must the Parquet walk, at the
    same row. Read against one budget for all (10), those rows look fine."""
    trace = copy.deepcopy(runs[None][0])
    assert len(next(s for s in trace.sequences if s.seq_id == seq_id).output_ids) > declared
    trace.header.options[BUDGETS][str(seq_id)] = declared
    if endings == "stripped":
        for step in trace.steps:
            for row in step.rows:
                row.finished, row.finish_reason = False, None
    from_json, from_parquet = _both(trace, tmp_path, rows)
    assert from_json["violation_count"] and from_json["first_violation"]["seq_id"] == seq_id
    assert from_parquet == from_json
