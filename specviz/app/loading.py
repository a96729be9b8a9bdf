"""Runs from files: the bundled example traces (shared by every session, analysed once) and uploads.

The checkout's `traces/` holds the bundled traces and `docs/` the pages the app links to; both
sit beside the `specviz` package, as in the Space.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from specviz.app import serve, uploads
from specviz.collector import collector_paused
from specviz.errors import SpecvizError
from specviz.trace.budget import DEFAULT_BUDGET, PUBLIC_BUDGET
from specviz.trace.columnar import ColumnarError
from specviz.trace.io import TraceError, load_trace, open_trace, parse_trace_bytes
from specviz.views import LoadedRun, analyse

ROOT = Path(__file__).resolve().parents[2]  # the checkout (the Space's folder): app.py, traces/, docs/
TRACES = ROOT / "traces"
DOCS = ROOT / "docs"  # docs/faults.md, linked from each fault's one-liner, is served from here
MAX_UPLOAD_BYTES = 32 * 1024 * 1024  # bundled traces are KBs; a 480x128 run is a few MB gzipped
# Opening pair, first bundled one wins: A is the run under investigation (the page opens on its
# first red cell), B the same prompts decoded correctly. Real text turning into garbage first.
DEFAULT_A = ("gemma-eqspec-uniform-advance.json.gz", "default-eqspec-stale-kv.json.gz")
DEFAULT_B = ("gemma-eqspec.json.gz", "default-eqspec.json.gz")


UPLOAD_GONE = uploads.UPLOAD_GONE
PUBLIC_LOCAL_REFUSED = "--trace opens a local file: refused in public mode (a Space reads no path a visitor chose)"
# `python app.py --trace PATH` (local only): the trace slot A opens on instead of the bundled default.
LOCAL_A: list[LoadedRun] = []
LOCAL_CHOICE = "--trace"  # the picker's value for it: no bundled name starts with "--"


def bundled_traces() -> list[str]:
    return sorted(p.name for p in TRACES.glob("*.json.gz"))


@functools.lru_cache(maxsize=32)
def _analysed_bundle(name: str, mtime: float) -> LoadedRun:
    """Bundled traces are shared by every session; analyse each once (mtime busts the cache)."""
    loaded = analyse(load_trace(TRACES / name), name)
    loaded.shared = True  # one object for every session: never counted or unloaded per session
    loaded.example = True
    loaded.link = name
    return loaded


def first_bundled(candidates: tuple[str, ...]) -> str | None:
    names = bundled_traces()
    return next((name for name in candidates if name in names), None)


def local_choice() -> tuple[str, str] | None:
    """(label, value) of the `--trace` run in slot A's picker, so the picker names the run shown."""
    if not LOCAL_A:
        return None
    name = LOCAL_A[0].source.removeprefix("local ")
    return (f"{name} (your --trace file)", LOCAL_CHOICE)


def slot_choices(label: str) -> list[Any]:
    """Slot `label`'s picker: the bundled traces, and for A the `--trace` run first when there is one."""
    local = local_choice() if label == "A" else None
    return ([local] if local else []) + bundled_traces()


def load_bundled(name: str | None) -> LoadedRun:
    if not name:
        raise SpecvizError("pick a bundled trace first")
    if name == LOCAL_CHOICE and LOCAL_A:  # slot A's `--trace` run, picked back
        return LOCAL_A[0]
    if name not in bundled_traces():  # only names from the list: no paths from the client
        raise SpecvizError(f"{name}: not a bundled trace")
    path = TRACES / name
    return _analysed_bundle(name, path.stat().st_mtime)


def load_default(candidates: tuple[str, ...]) -> LoadedRun | None:
    """The first bundled trace of `candidates`; a missing bundle leaves the slot empty."""
    try:
        return load_bundled(first_bundled(candidates))
    except (SpecvizError, TraceError):
        return None


def load_upload(path: str | None, session: str | None) -> LoadedRun:
    """`session`'s own upload at `path` (see `specviz.app.uploads`), read once and analysed."""
    too_big = "{name}: {mb:.1f} MB is over the {limit} MiB upload limit"
    raw = uploads.read_upload(path, session, MAX_UPLOAD_BYTES, too_big)
    name = Path(path or "").name  # the user knows the file by its name, never by Gradio's folder
    budget = PUBLIC_BUDGET if serve.public_mode() else DEFAULT_BUDGET  # a shared 2-core Space: tighter
    return analyse(parse_trace_bytes(raw, name, budget=budget), f"upload {name}")


def load_local(path: str | Path) -> LoadedRun:
    """A local trace file, the user's own (no budget): a Parquet one is opened, not read, so the
    check streams it and the grid reads the row group of the step it draws. Never in public mode."""
    if serve.public_mode():
        raise SpecvizError(PUBLIC_LOCAL_REFUSED)
    path = Path(path)
    try:
        with collector_paused():
            return analyse(open_trace(path), f"local {path.name}")
    except ColumnarError as exc:  # a row group the streaming check finds unreadable
        raise TraceError(str(exc)) from None


def open_local_a(path: str | Path) -> LoadedRun:
    """Load `path` (see `load_local`) as the run every new page opens in slot A."""
    loaded = load_local(path)
    loaded.link = LOCAL_CHOICE  # a link names "the file this app opened", never its path
    loaded.link_file = Path(path).name  # and that file's name, so another app's file is told apart
    loaded.shared = True  # one object for every session, like a bundled trace: never unloaded
    LOCAL_A[:] = [loaded]
    return loaded
