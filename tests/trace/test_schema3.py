"""Schema 3: the tree and head fields survive both containers; files of earlier versions still
read (a bundled version-2 JSON trace, and a Parquet file written without the version-3 columns)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow.parquet as pq
from drafting import MANY, decode

from specviz.analysis.check import check_trace
from specviz.trace.io import load_trace, save_trace
from specviz.trace.schema import SCHEMA_VERSION, TREE_ROW_FIELDS

ROOT = Path(__file__).resolve().parents[2]


def _tree_fields(trace):
    return [[getattr(r, f) for f in TREE_ROW_FIELDS] for s in trace.steps for r in s.rows]


def test_tree_and_head_fields_round_trip_in_json_and_parquet(tmp_path: Path) -> None:
    trace = decode("inplace", "head", 4, tree=2, prompts=MANY[:5])
    assert trace.header.schema_version == SCHEMA_VERSION >= 3  # schema 3 added these fields
    for name in ("t.json.gz", "t.parquet"):
        again = load_trace(save_trace(trace, tmp_path / name))
        assert _tree_fields(again) == _tree_fields(trace)
        assert (again.header.proposer, again.header.tree_branches) == ("head", 2)
        assert check_trace(again).violation_count == 0


def _as_version_2(data: dict) -> dict:
    """A trace as a version-2 writer left it: no header `proposer`/`tree_branches`, no tree fields."""
    data["header"]["schema_version"] = 2
    for key in ("proposer", "tree_branches"):
        data["header"].pop(key, None)
    for step in data["steps"]:
        for row in step["rows"]:
            for key in TREE_ROW_FIELDS:
                row.pop(key, None)
    return data


def test_a_version_2_trace_still_loads_and_checks_the_same(tmp_path: Path) -> None:
    bundled = ROOT / "traces" / "default-eqspec-stale-kv.json.gz"
    path = tmp_path / "stale-kv-v2.json.gz"
    path.write_bytes(
        gzip.compress(json.dumps(_as_version_2(json.loads(gzip.decompress(bundled.read_bytes())))).encode())
    )
    assert json.loads(gzip.decompress(path.read_bytes()))["header"]["schema_version"] == 2
    trace = load_trace(path)
    assert trace.header.proposer == "draft-model" and trace.header.tree_branches == 0
    assert all(r.tree_parents is None and r.head_source is None for s in trace.steps for r in s.rows)
    report = check_trace(trace)
    assert report.verdict == "desync" and report.first_violation.field in ("kv_len", "kv_mismatch_slot")


def test_a_parquet_file_without_the_version_3_columns_still_reads(tmp_path: Path) -> None:
    trace = decode("eqspec", "draft-model", 4, prompts=MANY[:5])
    path = save_trace(trace, tmp_path / "new.parquet")
    table = pq.read_table(path)
    old = table.drop_columns(list(TREE_ROW_FIELDS))  # as a version-2 writer left it
    # Keep the footer (header and sequences) of the original file: only the columns are older.
    meta = pq.read_metadata(path).metadata
    pq.write_table(old.replace_schema_metadata(meta), tmp_path / "old.parquet")
    again = load_trace(tmp_path / "old.parquet")
    assert [[r.accepted for r in s.rows] for s in again.steps] == [[r.accepted for r in s.rows] for s in trace.steps]
    assert check_trace(again).violation_count == 0


def test_an_oversized_node_attends_is_refused_in_one_line(tmp_path: Path) -> None:
    import pytest

    from specviz.trace.budget import Budget
    from specviz.trace.validate import TraceError

    trace = decode("eqspec", "draft-model", 4, tree=2, prompts=MANY[:2], max_new_tokens=2)
    trace.steps[0].rows[0].node_attends = [list(range(100))] * 100  # 10,000 items in one row
    path = save_trace(trace, tmp_path / "big.json.gz")
    with pytest.raises(TraceError, match="node_attends") as caught:
        load_trace(path, budget=Budget(max_row_tokens=16, max_query_len=16))
    assert "\n" not in str(caught.value)
