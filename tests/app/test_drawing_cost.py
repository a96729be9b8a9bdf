"""What a public visitor's run costs is bounded by what is drawn, not by what was uploaded (issue 43,
attacks 3-5): the widest step the public budget admits (1,024 rows x 64 query slots, 590-character
token texts) and its widest trees (3 steps x 255 rows of 257-node trees) cost at most 1 s of CPU
and send at most 2 MB for the upload's first render, each key press and the details panel; the
report costs at most 1 s and its file at most 5 MB, counted against the session and removed with
its run. Before, the grid drew every row: 3.4-4.1 s and 26-31 MB an answer, a 43 MB report.
CPU is `time.process_time` in this process (the handler as Gradio calls it)."""

from __future__ import annotations

import gc
import gzip
import json
import os
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import pytest

import app
from specviz.app import loading, share
from specviz.app.memory import RunMemory, unload_run
from specviz.trace.budget import PUBLIC_BUDGET
from specviz.trace.io import trace_from_dict
from specviz.views import LoadedRun, grid_view
from tools.attacks.files import big_trees_file, wide_step_file

CPU_S = 1.0
ANSWER_BYTES = 2 << 20
REPORT_BYTES = 5 << 20


def sent_bytes(value: Any) -> int:
    """About what Gradio sends for one output: a figure's JSON, a table's, a text, an update."""
    if isinstance(value, LoadedRun):
        return 0  # a gr.State stays on the server
    if isinstance(value, go.Figure):
        return len(value.to_json())
    if isinstance(value, pd.DataFrame):
        return len(value.to_json(orient="split"))
    if isinstance(value, dict):
        return sum(sent_bytes(v) for v in value.values())
    return len(json.dumps(value, default=str))


@pytest.fixture(scope="module")
def worst(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("worst")
    return {"wide": wide_step_file(folder), "trees": big_trees_file(folder)}


@pytest.fixture(scope="module")
def upload_a() -> Iterator[Callable[[Path], tuple[float, dict[Any, Any]]]]:
    """Slot A's upload event in public mode: (its CPU seconds, its outputs)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPACE_ID", "specviz/test")
        patch.setattr(loading.uploads, "read_upload", lambda p, session, limit, message: Path(p).read_bytes())
        demo = app.build_app()
        fn = next(f.fn for f in demo.fns.values() if f.api_name == "load_upload_a")
        request = types.SimpleNamespace(session_hash="visitor")

        def call(path: Path) -> tuple[float, dict[Any, Any]]:
            cpu = time.process_time()
            out = fn(str(path), None, 40, False, request=request)
            return time.process_time() - cpu, out

        try:
            yield call
        finally:
            demo.close()


@pytest.mark.parametrize("shape", ["wide", "trees"])
def test_the_worst_public_shapes_cost_what_is_drawn(shape: str, worst: dict[str, Path], upload_a: Any) -> None:
    raw = worst[shape].read_bytes()
    renders, totals = [], []
    # CPU seconds on a shared machine move with its load (the first render of the trees is
    # 0.7-0.9 s alone, and read 1.05 s, then 1.20 s and 1.42 s, beside a full suite): the best of
    # three uploads, each against its own parse and check, as any timing here is taken (repeats, warm).
    for _ in range(3):
        cpu = time.process_time()
        loading.analyse(loading.parse_trace_bytes(raw, shape, budget=PUBLIC_BUDGET), shape)
        load_cpu = time.process_time() - cpu
        total_cpu, out = upload_a(worst[shape])
        renders.append(total_cpu - load_cpu)
        totals.append(total_cpu)
    loaded = next(v for v in out.values() if isinstance(v, LoadedRun))
    assert any("showing" in str(v) and "rows" in str(v) for v in out.values())  # "showing N of M rows"
    assert min(renders) <= CPU_S, f"first render {min(renders):.2f} s"
    assert min(totals) <= 3.0  # issue 23's goal for the whole upload event
    assert sent_bytes(out) <= ANSWER_BYTES, f"{sent_bytes(out) / 2**20:.1f} MB"

    step = loaded.trace.steps[0]
    row = step.rows[0].row
    for key in ("j", "j", "n", "k"):  # as the key handler: the target, then its grid
        cpu = time.process_time()
        target = share.key_target(loaded, key, 0, row)
        if target is not None:
            view = grid_view(loaded, target[0], target[1], 40)
            row = target[1]
            assert time.process_time() - cpu <= CPU_S
            assert sent_bytes(view.__dict__) <= ANSWER_BYTES
    far = step.rows[-1].row  # the last page, picked from the row picker
    view = grid_view(loaded, 0, far, 40)
    assert len(view.row_choices) == len(step.rows) + 1 and f"rows {far}" not in view.step_text
    cpu = time.process_time()
    assert len(share.cell_details(loaded, 0, far, None)) < 64 << 10
    assert time.process_time() - cpu <= CPU_S


def test_a_report_is_bounded_counted_and_removed_with_its_run(worst: dict[str, Path]) -> None:
    raw = worst["wide"].read_bytes()
    loaded = loading.analyse(loading.parse_trace_bytes(raw, "wide", budget=PUBLIC_BUDGET), "upload wide")
    memory = RunMemory(ceiling=1 << 40)
    memory.track(loaded, "visitor")
    before = memory.total()
    cpu = time.process_time()
    path = share.write_report(loaded)
    assert time.process_time() - cpu <= CPU_S
    size = os.path.getsize(path)
    assert size <= REPORT_BYTES, f"{size / 2**20:.1f} MB"
    memory.grew(loaded, "visitor")
    assert memory.total() - before == size  # the session's temp file counts against it
    unload_run(loaded)  # the ceiling unloads the run: its file goes too
    assert not os.path.exists(path)

    again = loading.analyse(trace_from_dict(json.loads(gzip.decompress(raw))), "upload wide")
    path = share.write_report(again)
    del again  # the session's state is freed (tab closed, or expired)
    gc.collect()
    assert not os.path.exists(path)
