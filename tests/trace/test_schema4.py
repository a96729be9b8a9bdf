"""Schema 5: each `prefill_chunks` entry gained its carrier step (EXSPEC's mixed chunked prefill).
The carriers survive both containers, and version-4 files (4-item chunks) still read and check
the same, in JSON and in Parquet."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from exactness import PROMPTS, pair_for

from specviz.analysis.check import check_trace
from specviz.analysis.prefill_checks import carried_chunks
from specviz.engine.config import RunConfig
from specviz.engine.run import run
from specviz.trace.io import load_trace, save_trace
from specviz.trace.schema import SCHEMA_VERSION, Trace


def _mixed(fault: str | None = None) -> Trace:
    config = RunConfig(
        method="exspec", batch_size=3, draft_k=2, max_new_tokens=6, prefill_chunk=4, fault=fault, reference=False
    )
    return run(pair_for("llama"), PROMPTS[:9], config)


def _chunks(trace: Trace) -> list:
    return [r.prefill_chunks for s in trace.steps for r in s.rows]


def test_carriers_round_trip_in_json_and_parquet(tmp_path: Path) -> None:
    trace = _mixed()
    assert trace.header.schema_version == SCHEMA_VERSION == 5
    assert carried_chunks(trace)
    for name in ("t.json.gz", "t.parquet"):
        again = load_trace(save_trace(trace, tmp_path / name))
        assert _chunks(again) == _chunks(trace)
        assert carried_chunks(again) == carried_chunks(trace)
        assert check_trace(again).violation_count == 0


def _as_version_4(data: dict) -> dict:
    """A trace as a version-4 writer left it: chunks of [start, end, position, slots before]."""
    data["header"]["schema_version"] = 4
    for step in data["steps"]:
        for row in step["rows"]:
            if row.get("prefill_chunks"):
                row["prefill_chunks"] = [chunk[:4] for chunk in row["prefill_chunks"]]
    return data


def test_a_version_4_trace_still_reads_and_checks_the_same(tmp_path: Path) -> None:
    trace = _mixed(fault="chunk-boundary-feed")
    path = save_trace(trace, tmp_path / "v5.json.gz")
    old = tmp_path / "v4.json.gz"
    old.write_bytes(gzip.compress(json.dumps(_as_version_4(json.loads(gzip.decompress(path.read_bytes())))).encode()))
    again = load_trace(old)
    assert again.header.schema_version == 4 and not carried_chunks(again)
    assert all(len(c) == 4 for chunks in _chunks(again) if chunks for c in chunks)
    assert check_trace(again).to_dict() == check_trace(trace).to_dict()
    # the same version-4 trace in the Parquet container
    assert check_trace(load_trace(save_trace(again, tmp_path / "v4.parquet"))).to_dict() == check_trace(trace).to_dict()
