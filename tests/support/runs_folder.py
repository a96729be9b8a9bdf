"""A folder of runs for the `--runs` tests: readable runs of both verdicts and one file that is no trace."""

from __future__ import annotations

from pathlib import Path

from specviz.trace.io import save_trace
from specviz.trace.synthetic import synthetic_trace


def make_runs_folder(folder: Path) -> Path:
    """A clean JSON run, a Parquet run with one position off (a desync), a file that is no trace."""
    save_trace(synthetic_trace(6, 3, 3, 8), folder / "clean.json.gz")
    broken = synthetic_trace(5, 2, 2, 6)
    broken.steps[1].rows[-1].position_ids[0] += 1  # a position one past its token: a desync
    save_trace(broken, folder / "desync.parquet")
    (folder / "corrupt.json").write_text('{"format": "specviz-trace", "hea')
    return folder
