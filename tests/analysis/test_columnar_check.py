"""The columnar walk of a Parquet trace (`specviz.analysis.columnar`) says exactly what the row-by-row
walk of the same trace in JSON says: same verdicts, violations, messages, first violation, skipped
checks and metrics, on clean runs and on hundreds of small edits of them (every row field, step fields, the
header's rules, the sequences), with row groups cut at every few steps."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from pathlib import Path

import pytest

from specviz.analysis import check as check_module
from specviz.analysis.check import check_trace
from specviz.analysis.metrics import step_totals, summary
from specviz.analysis.text import render_report
from specviz.trace.columnar import ParquetTraceWriter
from specviz.trace.fuzz import mutate_dict
from specviz.trace.io import TraceError, load_trace, open_trace, parse_trace_bytes, trace_from_dict, trace_to_json
from specviz.trace.schema import RowRecord, Trace
from specviz.trace.synthetic import synthetic_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
ROW_FIELDS = [f.name for f in dataclasses.fields(RowRecord)]


def _parquet(trace: Trace, path: Path, rows: int) -> Path:
    writer = ParquetTraceWriter(path, row_group_rows=rows)
    for step in trace.steps:
        writer.add_step(step)
    return writer.close(trace.header, trace.sequences)


def _same_report(trace: Trace, path: Path, rows: int) -> None:
    """Checked in memory (the JSON walk) and from Parquet (the columnar walk): identical reports."""
    try:  # what a JSON file of this trace would load as (an edit may make it unreadable)
        trace = parse_trace_bytes(trace_to_json(trace).encode(), "edited")
    except TraceError:
        return
    trace.steps = [step for step in trace.steps if step.rows]  # Parquet stores no step without rows
    report = check_trace(trace)
    columnar = open_trace(_parquet(trace, path, rows))
    columnar_report = check_trace(columnar)
    assert columnar_report.to_dict() == report.to_dict()
    assert summary(columnar) == summary(trace)  # the metrics' own walk is columnar too
    assert columnar_report.totals == report.totals == step_totals(trace)  # and the check's walk gathers them
    # Sequences enter the per-sequence sums in order of first appearance, whichever walk summed them.
    assert list(columnar_report.totals.per_seq) == list(report.totals.per_seq) == list(step_totals(columnar).per_seq)
    assert render_report(columnar, columnar_report) == render_report(trace, report)


def _bases() -> dict[str, Trace]:
    plain = synthetic_trace(7, 3, 3, 12)
    bases = {"synthetic": plain}
    ragged = copy.deepcopy(plain)
    ragged.header.layout = "unspecified"
    bases["unspecified"] = ragged
    no_finish = copy.deepcopy(plain)
    no_mask = copy.deepcopy(plain)
    no_targets = copy.deepcopy(plain)
    for edited, names in ((no_finish, ("finished", "finish_reason")), (no_mask, ("mask_rle",)), (no_targets, ())):
        for step in edited.steps:
            for row in step.rows:
                for name in names:
                    setattr(row, name, [] if name == "mask_rle" else (False if name == "finished" else None))
                if edited is no_targets:
                    row.target_tokens = []
    bases.update(no_finish=no_finish, no_mask=no_mask, no_targets=no_targets)
    eos = copy.deepcopy(plain)  # a frequent token declared EOS: sequences continue past it
    eos.header.eos_token_ids = [eos.sequences[0].output_ids[2]]
    bases["eos"] = eos
    for name in ("default-eqspec.json.gz", "default-exspec.json.gz", "default-inplace.json.gz"):
        bases[name] = load_trace(TRACES / name)
    return bases


BASES = _bases()


@pytest.mark.parametrize("name", sorted(BASES))
@pytest.mark.parametrize("rows", [1, 4, 16_384])
def test_clean_and_variant_runs_match(name: str, rows: int, tmp_path: Path) -> None:
    _same_report(copy.deepcopy(BASES[name]), tmp_path / "t.parquet", rows)


@pytest.mark.parametrize("name", sorted(p.name for p in TRACES.glob("*.json.gz")))
def test_bundled_faults_match_with_small_row_groups(name: str, tmp_path: Path) -> None:
    _same_report(load_trace(TRACES / name), tmp_path / "t.parquet", 5)


def _edit_value(rng: random.Random, value: object, other: object) -> object:
    """A nearby wrong value: off by one, another row's, empty, null, a list one item off."""
    choices: list[object] = [other, None]
    if isinstance(value, bool):
        choices.append(not value)
    elif isinstance(value, int):
        choices += [value + 1, value - 1, 0]
    elif isinstance(value, str):
        choices += ["eos", "length"]
    elif isinstance(value, list):
        choices += [[], value[:-1], value + (value[-1:] if value else [[1, 1]])]
        if value and isinstance(value[0], int):
            i = rng.randrange(len(value))
            choices.append(value[:i] + [value[i] + 1] + value[i + 1 :])
        if value and isinstance(value[0], list):
            i = rng.randrange(len(value))
            choices.append(value[:i] + [[value[i][0], value[i][1] + rng.choice((-1, 1))]] + value[i + 1 :])
            choices.append(value[:i] + [[0, 1]] + value[i:])
    return copy.deepcopy(rng.choice(choices))


def _edit(trace: Trace, rng: random.Random) -> None:
    """One edit of a row field (mostly), a step field, the header's rules or a sequence."""
    kind = rng.random()
    if kind < 0.8:
        step = rng.choice(trace.steps)
        row, other = rng.choice(step.rows), rng.choice(rng.choice(trace.steps).rows)
        name = rng.choice(ROW_FIELDS)
        setattr(row, name, _edit_value(rng, getattr(row, name), getattr(other, name)))
    elif kind < 0.88:
        step = rng.choice(trace.steps)
        name = rng.choice(["cache_len", "query_len", "step"])
        setattr(step, name, max(0, getattr(step, name) + rng.choice((-1, 1))))
    elif kind < 0.94:
        header = trace.header
        name = rng.choice(["draft_k", "max_new_tokens", "eos_token_ids", "complete", "layout"])
        value = {
            "draft_k": header.draft_k + rng.choice((-1, 1)),
            "max_new_tokens": header.max_new_tokens + rng.choice((-1, 1)),
            "eos_token_ids": [rng.choice(rng.choice(trace.sequences).output_ids or [0])],
            "complete": not header.complete,
            "layout": rng.choice(["unspecified", "fixed-slots", "left-padded"]),
        }[name]
        setattr(header, name, value)
    else:
        seq = rng.choice(trace.sequences)
        name = rng.choice(["output_ids", "reference_ids", "finish_reason"])
        value = _edit_value(rng, getattr(seq, name), getattr(rng.choice(trace.sequences), name))
        setattr(seq, name, value if name != "output_ids" or value is not None else [])


@pytest.mark.parametrize("seed", range(4))  # 100 edited runs; 600 more ran once by hand: 0 mismatches
def test_edited_runs_match(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    names = sorted(BASES)
    for case in range(25):
        trace = copy.deepcopy(BASES[names[(seed * 25 + case) % len(names)]])
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            _edit(trace, rng)
        _same_report(trace, tmp_path / f"t{case}.parquet", rng.choice((1, 3, 8, 16_384)))


@pytest.mark.parametrize("seed", range(3))
def test_fuzzed_runs_match(seed: int, tmp_path: Path) -> None:
    """The loader fuzzer's mutations (`specviz.trace.fuzz`) of a run that still loads check alike."""
    rng = random.Random(seed)
    text = trace_to_json(BASES["synthetic"])
    for case in range(40):  # most mutations are refused by the loader; a few in ten still load
        try:
            trace = trace_from_dict(mutate_dict(json.loads(text), rng, rng.randrange(1, 4)))
        except TraceError:
            continue
        _same_report(trace, tmp_path / f"f{case}.parquet", rng.choice((1, 3, 16_384)))


def test_clean_row_groups_take_the_columnar_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: on a clean run every step is applied by the columnar walk, none row by row."""
    walked = []
    monkeypatch.setattr(check_module, "check_step", lambda *args: walked.append(args[2]))
    path = _parquet(BASES["synthetic"], tmp_path / "t.parquet", 4)
    assert check_trace(open_trace(path)).verdict == "clean"
    assert walked == []


@pytest.mark.parametrize("cells", [0, 1 << 22])
def test_per_sequence_sums_as_arrays_or_per_slice_are_the_row_walks(cells: int, tmp_path: Path, monkeypatch) -> None:
    """`add_columns` sums sequences as arrays over the run (`SequenceSums`) unless [sequences, k + 1]
    is too many cells; both give the row-by-row walk's sums, in its order, with row groups that
    start mid-batch and a row group walked row by row in between (a flagged step)."""
    from specviz.analysis import metrics

    monkeypatch.setattr(metrics, "MAX_DENSE_CELLS", cells)
    trace = synthetic_trace(9, 4, 3, 12)
    random.Random(7).shuffle(trace.sequences)  # the footer's order is not the order rows appear in
    trace.steps[5].rows[1].accepted += 1  # one flagged step: its row group goes row by row
    _same_report(trace, tmp_path / "s.parquet", rows=5)


@pytest.mark.parametrize("budgets", [{"1": 5, "2": 11, "4": 0}, {"1": 12}, {"1": "x", "2": -1}])
def test_per_sequence_budgets_match(budgets: dict, tmp_path: Path) -> None:
    """A watched run's own budgets (`header.options.sequence_budgets`): the columnar walk judges each
    row, ending and metric against the same budget as the row walk (12: the run's; bad ones: ignored)."""
    trace = copy.deepcopy(BASES["synthetic"])
    trace.header.options["sequence_budgets"] = budgets
    over = {int(s) for s, n in budgets.items() if isinstance(n, int) and 0 <= n < 12}
    assert (check_trace(trace).verdict == "clean") == (not over)  # outputs of 12 tokens: past 5, 11, 0
    _same_report(trace, tmp_path / "b.parquet", rows=4)
