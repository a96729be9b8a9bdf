"""Issue 34: the memory ceiling counts what a loaded run (or an opened probe report) really keeps.

The oracle is the process's own RSS: in a fresh interpreter the same file is loaded three times
and kept; each run after the first adds what one run keeps (the first also pays the allocator's
one-off growth), and the count must be within 20% of that growth. A hostile trace whose bulk is
exactly what the old estimate left out (mask runs, long emoji strings in options and the piece
table) is measured with a normal trace and a probe report.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specviz.app.memory import RunMemory, kept_bytes
from tools.attacks.files import hidden_memory_file, probe_report_file, session_file

ROOT = Path(__file__).resolve().parents[2]

_MEASURE = textwrap.dedent(
    """
    import gc, json, sys
    from pathlib import Path
    from specviz.app.memory import estimate_run_bytes, release_memory
    from specviz.app.probe_tab import _parse
    from specviz.trace.budget import PUBLIC_BUDGET
    from specviz.trace.io import parse_trace_bytes
    from specviz.views.run import analyse

    def rss():
        return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) * 1024

    def load(path):
        raw = path.read_bytes()
        if path.name.startswith("probe"):
            return _parse(raw, path.name)
        return analyse(parse_trace_bytes(raw, path.name, budget=PUBLIC_BUDGET), path.name)

    found = {}
    for name in sys.argv[1:]:
        kept, marks = [], []
        for _ in range(3):
            kept.append(load(Path(name)))
            gc.collect()
            release_memory()
            marks.append(rss())
        found[Path(name).name] = {"grew": (marks[-1] - marks[0]) / 2, "counted": estimate_run_bytes(kept[0])}
        del kept
        gc.collect()
        release_memory()
    print(json.dumps(found))
    """
)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, float]]:
    folder = tmp_path_factory.mktemp("kept")
    # The report first: a later file would reuse the pages an earlier one freed, and grow less.
    files = [probe_report_file(folder, 6_000), hidden_memory_file(folder, level=1), session_file(folder)]
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, *map(str, files)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["hidden-memory.json.gz", "session-370k.json.gz", "probe-6000.json"])
def test_the_count_is_the_rss_a_kept_run_adds(measured: dict[str, dict[str, float]], name: str) -> None:
    grew, counted = measured[name]["grew"], measured[name]["counted"]
    assert grew > 4 * 2**20, f"{name}: too small to measure ({grew / 2**20:.1f} MB)"
    assert 0.8 <= counted / grew <= 1.2, f"{name}: counted {counted / 2**20:.1f} MB, RSS grew {grew / 2**20:.1f} MB"


def test_the_hostile_trace_is_counted_as_heavy_as_it_is(measured: dict[str, dict[str, float]]) -> None:
    """The old estimate counted this 100 KB gzip as 0.6 MB; it keeps ~80 MB a run."""
    assert measured["hidden-memory.json.gz"]["grew"] > 50 * 2**20
    assert measured["hidden-memory.json.gz"]["counted"] > 50 * 2**20


class _Held:
    """A run as the ceiling sees it: whatever it holds."""

    def __init__(self, chars: int) -> None:
        self.options = {f"o{i}": "\U0001f600" * (chars // 100) for i in range(100)}  # 4 bytes a char
        self.mask_rle = [[1, 1] for _ in range(chars // 40)]


def test_strings_count_their_bytes_and_shared_objects_count_once() -> None:
    text = "\U0001f600" * 1_000_000
    assert kept_bytes(text) >= 4_000_000
    assert kept_bytes([text, text, {"k": text}]) < 4_100_000  # one string, held three times
    assert kept_bytes(list(range(1000, 101_000))) >= 100_000 * (8 + 28)  # a list's slots and its ints
    assert kept_bytes([[1, 5]] * 10) < kept_bytes([[1, 5] for _ in range(10)])  # one mask run, or ten
    nested: list = []
    for _ in range(5_000):  # deeper than Python's recursion limit: the walk uses its own stack
        nested = [nested]
    assert kept_bytes(nested) >= 5_000 * 56


def test_the_ceiling_evicts_on_the_count_across_sessions() -> None:
    from specviz.app.memory import estimate_run_bytes

    memory = RunMemory(ceiling=10 * 2**20, estimate=estimate_run_bytes)
    runs = [_Held(1_000_000) for _ in range(4)]  # ~4 MB of emoji and ~2 MB of mask runs each
    for i, run in enumerate(runs):
        memory.begin(f"s{i}")
        memory.track(run, f"s{i}")
        memory.end(f"s{i}")
    assert [getattr(r, "evicted", False) for r in runs] == [True, True, True, False]
    assert memory.total() <= 10 * 2**20


def test_figures_drawn_later_are_counted_and_can_make_room() -> None:
    from specviz.app.memory import estimate_run_bytes

    memory = RunMemory(ceiling=8 * 2**20, estimate=estimate_run_bytes)
    old, new = _Held(400_000), _Held(400_000)
    new.figures = {}
    for session, run in (("s0", old), ("s1", new)):
        memory.begin(session)
        memory.track(run, session)
        memory.end(session)
    assert memory.total() < 8 * 2**20 and not getattr(old, "evicted", False)  # both fit
    new.figures["heatmap"] = {"z": [[float(i)] * 100 for i in range(20_000)]}  # ~17 MB as drawn
    memory.grew(new, "s1")
    assert memory.total() > 10 * 2**20  # the figure is counted (the drawing session keeps its run)...
    assert getattr(old, "evicted", False) and not getattr(new, "evicted", False)  # ...and the idle one goes


def test_an_opened_probe_report_is_counted_and_unloaded_like_a_run() -> None:
    import warnings

    from specviz.app.loading import TRACES
    from specviz.app.memory import UNLOADED_MESSAGE, estimate_run_bytes, install_memory, unload_run
    from specviz.app.probe_tab import _parse

    report = _parse((TRACES / "probe-example.json").read_bytes(), "probe-example.json")
    seen = []

    class Fn:
        def __init__(self, fn):
            self.fn = fn

    class Demo:
        fns = {0: Fn(lambda state: seen.append(state) or {"state": report})}

    class Run:  # the app's run type: a report is counted besides it
        shared = False

    memory = RunMemory(ceiling=2**30, estimate=estimate_run_bytes)
    install_memory(Demo, memory, Run)
    Demo.fns[0].fn(None)
    assert memory.total() >= kept_bytes(report) > 10_000  # the report this handler put in a state
    unload_run(report)
    assert report.prompts == () and report.evicted
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Demo.fns[0].fn(report)
    assert seen[-1] is None and any(UNLOADED_MESSAGE in str(w.message) for w in caught)
