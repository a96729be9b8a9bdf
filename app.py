"""specviz web app: see where batch speculative decoding desynchronises.

`python app.py` serves it (`--host` / `--port`, or GRADIO_SERVER_NAME / GRADIO_SERVER_PORT;
`--public` as on a Space; `--trace PATH`, local only, opens a .parquet or .json(.gz) trace in
slot A: a Parquet one is read a row group at a time; `--runs DIR`, local only, lists a folder's
traces, each openable in A or B; `--probe PATH`, local only, opens a probe report in its section,
so a probe's replay trace (`--trace`) and the report show on one page). Tests import `build_app` and `launch`.
This file only assembles the page from `specviz.app`: two run slots, A and B, each loaded from
a bundled trace, an uploaded trace or a live run; the detail tabs inspect one slot at a time, the
outputs tab shows the other beside it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import gradio as gr

from specviz.app import doc_pages, events, files, handlers, lanes, memory, serve, uploads
from specviz.app.assets import CSS, INTRO
from specviz.app.detail import build_detail_tabs
from specviz.app.live import LIVE_FOLDER, LIVE_GATE, PUBLIC, RUN_MEMORY, load_model_pair
from specviz.app.loading import DEFAULT_A, DEFAULT_B, MAX_UPLOAD_BYTES, open_local_a
from specviz.app.probe_tab import ProbeSection, open_local_probe, wire_probe
from specviz.app.run_slots import build_inspect_switch, build_run_slot
from specviz.app.runs_tab import FOLDER, RunsSection, open_runs_folder
from specviz.errors import SpecvizError
from specviz.trace.io import TraceError
from specviz.views import LoadedRun

# Bounded, so memory stays flat under a flood; live runs take at most serve.MAX_PENDING_LIVE of it
# (refused before they queue), so loading and inspecting always find room.
QUEUE_SIZE = 256
INSPECT_CONCURRENCY = 4  # loading and inspecting: their own lane, never behind a live run


def build_app() -> gr.Blocks:
    # delete_cache: Gradio's own copies (uploads, downloads) go after FILE_MAX_AGE_S, checked every 5 min.
    with gr.Blocks(title="specviz", delete_cache=(300, serve.FILE_MAX_AGE_S)) as demo:
        gr.Markdown(INTRO, elem_id="sv-intro")
        runs = RunsSection.build(FOLDER[0]) if FOLDER else None  # `--runs DIR`, local only
        with gr.Row(equal_height=False):
            slot_a = build_run_slot("A", DEFAULT_A)
            slot_b = build_run_slot("B", DEFAULT_B)
        inspect = build_inspect_switch()
        ui = build_detail_tabs()  # the A vs B comparison is its last tab
        compare = ui.compare
        probe = ProbeSection.build()  # saved `specviz probe` reports: opened, never a server contacted
        events.wire(demo, slot_a, slot_b, inspect, compare, ui)
        wire_probe(probe, handlers.user_errors)  # bound after the rest: the page's other event numbers stay
        if runs is not None:
            events.wire_runs(runs, slot_a, slot_b, inspect, compare, ui)  # only with --runs: bound last
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=INSPECT_CONCURRENCY)
    serve.install_gate(demo, LIVE_GATE)  # one live run per visitor, refused before it queues
    lanes.install_fair_lanes(demo)  # every lane: one waiting job per visitor and kind, least served first
    uploads.install_upload_claims(demo)  # an upload is read only by the session that queued it first
    memory.install_memory(demo, RUN_MEMORY, LoadedRun)  # the loaded runs' ceiling; an unloaded run says so
    demo.unload(memory.release_memory)  # a closed tab's runs are freed by Gradio; give the memory back
    return demo


def launch(demo: gr.Blocks, **kwargs: Any) -> Any:
    """Launch with the app's settings; host and port come from GRADIO_SERVER_NAME/PORT or kwargs."""
    # docs/faults.md and probe.md, linked from the page, under a route that names no server path.
    app_kwargs = {**kwargs.pop("app_kwargs", {}), "routes": doc_pages.doc_routes()}
    return demo.launch(max_file_size=MAX_UPLOAD_BYTES, css=CSS, theme=gr.themes.Soft(), app_kwargs=app_kwargs, **kwargs)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="app.py", description="Serve the specviz app.", allow_abbrev=False)
    parser.add_argument("--public", action="store_true", help="serve as on a public Space (SPACE_ID does too)")
    parser.add_argument("--trace", metavar="PATH", help="local only: open this trace file in slot A")
    parser.add_argument("--runs", metavar="DIR", help="local only: list this folder's traces (specviz runs DIR)")
    parser.add_argument("--probe", metavar="PATH", help="local only: open this probe report (beside --trace's run)")
    parser.add_argument("--port", type=int, default=None, help="port to serve on (default 7860, or GRADIO_SERVER_PORT)")
    parser.add_argument(
        "--host", default=None, help="address to listen on (default 127.0.0.1, or GRADIO_SERVER_NAME; 0.0.0.0: all)"
    )
    return parser.parse_known_args(argv)[0]  # Gradio's and the test runner's own flags pass through


def open_trace_arg(path: str | None) -> None:
    """`--trace PATH`: load it into slot A, or exit with one line (refused in public mode)."""
    if path is None:
        return
    try:
        open_local_a(path)
    except (SpecvizError, TraceError, OSError) as exc:
        sys.exit(f"app.py: {exc}")


def open_probe_arg(path: str | None) -> None:
    """`--probe PATH`: the probe report every page shows open, or exit with one line."""
    if path is None:
        return
    try:
        open_local_probe(path)
    except (SpecvizError, OSError) as exc:
        sys.exit(f"app.py: {exc}")


def open_runs_arg(folder: str | None) -> None:
    """`--runs DIR`: check the folder's traces for the page, or exit with one line."""
    if folder is None:
        return
    try:
        open_runs_folder(folder)
    except (SpecvizError, OSError) as exc:
        sys.exit(f"app.py: {exc}")


def check_address(args: argparse.Namespace) -> None:
    """Exit with one line naming `--port` when the app could not listen there (out of range, or in
    use by another server): Gradio's own error is a traceback naming its `server_port`."""
    import os
    import socket

    host = args.host or os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1"
    given = args.port if args.port is not None else os.environ.get("GRADIO_SERVER_PORT", "7860")
    flag = "--port" if args.port is not None else "GRADIO_SERVER_PORT" if "GRADIO_SERVER_PORT" in os.environ else None
    named = f"{flag} {given}" if flag else f"port {given} (the default)"
    port = int(given) if str(given).isdigit() else -1
    if not 0 < port < 65536:
        sys.exit(f"app.py: {named}: a port is a whole number from 1 to 65535")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
            probe.bind((host, port))
    except OSError as exc:
        sys.exit(f"app.py: cannot listen on {host}:{port} ({exc.strerror or exc}): pass another with --port N")


def main() -> None:
    args = parse_args()
    check_address(args)  # a port in use or out of range: one line, before seconds of start-up
    open_trace_arg(args.trace)  # before anything starts: a bad file or public mode exits now
    open_runs_arg(args.runs)
    open_probe_arg(args.probe)
    # Gradio's cache in a folder of this process (before the app is built); an earlier crashed
    # process's folders go now, this one's on SIGTERM / SIGINT.
    gradio_temp = files.own_gradio_temp()
    if PUBLIC:
        # Load the bundled pair before the first visitor: a first live run would otherwise import
        # transformers' model code under the import lock, and other visitors' requests wait on it.
        from specviz.engine.models import DEFAULT_DRAFT, DEFAULT_TARGET

        load_model_pair(DEFAULT_TARGET, DEFAULT_DRAFT, True)
    files.start_sweeper()  # refused uploads leave empty temp files Gradio's cleanup misses
    demo = build_app()
    files.on_shutdown([gradio_temp, LIVE_FOLDER.path], demo)
    files.start_reaper([gradio_temp, LIVE_FOLDER.path])  # and after the process, however it ends
    memory.tune_gc_for_serving()  # last before serving: what start-up built is never walked again
    try:
        launch(demo, **server_address(args))
    except OSError as exc:  # taken since check_address looked: still one line, naming the flag
        sys.exit(f"app.py: {serve_failure(exc)}: pass another port with --port N")


def serve_failure(exc: OSError) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def server_address(args: argparse.Namespace) -> dict[str, Any]:
    """`--host` / `--port` as Gradio's launch arguments; unset ones leave Gradio's own defaults and
    its GRADIO_SERVER_NAME / GRADIO_SERVER_PORT in charge."""
    given = {"server_name": args.host, "server_port": args.port}
    return {key: value for key, value in given.items() if value is not None}


if __name__ == "__main__":
    main()
