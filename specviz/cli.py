"""`python -m specviz ...`: record a run into a trace, check a trace.

Every user-facing failure is one line on stderr and a non-zero exit, never a traceback:
exit 2 for bad input (missing path, malformed trace, bad pair), 130 for an interrupted run
(whose partial trace is still written, marked incomplete).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from specviz.cli_args import EXIT_BAD_INPUT, build_parser, command_word
from specviz.console import print_to_pipe
from specviz.errors import SpecvizError
from specviz.files import check_output_path
from specviz.startup import EXIT_INTERRUPTED
from specviz.trace.io import TraceError

EXIT_UNREADABLE = 3  # `check`: a watched run not read to the end, with no violation before that


def main_exit() -> NoReturn:
    """The `specviz` console script."""
    # From here Ctrl-C raises KeyboardInterrupt again: the engine turns it into a partial trace.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    status = main()
    if status == EXIT_INTERRUPTED:
        # A KeyboardInterrupt that hit library code (torch, transformers imports) can leave the
        # interpreter set to re-raise SIGINT at exit (status -2); everything is saved and said.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C at start-up, while loading models, or while saving
        print("specviz: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except RecursionError:  # a last guard: nested input that a reader did not name itself
        print("specviz: error: input nested too deeply", file=sys.stderr)
        return EXIT_BAD_INPUT


def _main(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(command_word(argv) or "").parse_args(argv)  # "": no options built
    if not getattr(args, "no_limits", False):
        return _run(args)
    from specviz.trace.budget import file_limits, set_file_limits

    limits = file_limits()
    set_file_limits(None)  # a trusted big run: its parts may decode past FileLimits, for this command
    try:
        return _run(args)
    finally:
        set_file_limits(limits)


def _run(args: argparse.Namespace) -> int:
    try:
        if args.command == "record":
            from specviz.recording import cmd_record

            return cmd_record(args)
        if args.command == "check":
            return cmd_check(args)
        if args.command == "bench":
            return cmd_bench(args)
        if args.command == "watch":
            from specviz.watch.cli import cmd_watch

            return cmd_watch(args)
        if args.command == "probe":
            from specviz.probe.cli import cmd_probe

            return cmd_probe(args)
        if args.command == "convert":
            return cmd_convert(args)
        if args.command == "runs":
            return cmd_runs(args)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "export":
            return cmd_export(args)
    except (SpecvizError, TraceError) as exc:
        print(f"specviz: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ValueError as exc:  # argument combinations the engine refuses
        print(f"specviz: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Exit 0 for clean/numerical, 1 for desync/unexplained, 3 for unreadable; a TraceError propagates (exit 2)."""
    from specviz.analysis.check import check_trace
    from specviz.analysis.metrics import summary
    from specviz.analysis.text import render_report
    from specviz.trace.io import open_trace

    trace = open_trace(args.trace)  # a Parquet trace streams: one row group in memory at a time
    report = check_trace(trace)
    if args.json:
        payload = report.to_dict()
        payload["metrics"] = summary(trace, report.totals)  # the check's walk gathered the sums
        print_to_pipe(json.dumps(payload))
    else:
        print_to_pipe(render_report(trace, report))
    if report.verdict == "unreadable":
        return EXIT_UNREADABLE
    return 0 if report.verdict in ("clean", "numerical") else 1


def cmd_convert(args: argparse.Namespace) -> int:
    from specviz.trace.io import convert_trace

    src, dst = Path(args.input), Path(args.output)
    if src.resolve() == dst.resolve():
        raise SpecvizError(f"{dst}: input and output are the same file")
    check_output_path(dst, args.force)
    steps = convert_trace(src, dst)
    print(f"{src} -> {dst}: {steps} steps, {dst.stat().st_size} bytes")
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from specviz.analysis.runs import check_column, render_runs, runs_frame, scan_runs, sort_rows
    from specviz.analysis.runs_cache import RunsCache

    check_column(args.sort)  # before any file is checked
    if args.csv:
        check_output_path(Path(args.csv), args.force)
    cache = RunsCache(args.cache) if args.cache else None
    show = sys.stderr.isatty() if args.progress is None else args.progress
    # A file can take seconds or milliseconds: draw every count (tqdm's default skips updates less
    # than 0.1 s apart, so a quick folder would show no count at all).
    with tqdm(desc="runs", unit="file", file=sys.stderr, disable=not show, leave=False, mininterval=0) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        rows = sort_rows(scan_runs(args.folder, args.recursive, cache, progress), args.sort, args.reverse)
    if args.csv:
        runs_frame(rows).to_csv(args.csv, index=False)
        print(f"{args.folder}: {len(rows)} runs -> {args.csv}")
    elif args.json:
        print_to_pipe(json.dumps({"folder": str(args.folder), "runs": [r.to_dict() for r in rows]}))
    else:
        print_to_pipe(render_runs(rows) if rows else f"{args.folder}: no trace files")
    return 0


def _derived_out(trace: str, given: str | None, suffix: str) -> Path:
    """`given`, or the trace's path with its trace suffixes replaced by `suffix`."""
    if given:
        return Path(given)
    path = Path(trace)
    name = path.name
    for ending in (".json.gz", ".json", ".parquet", ".gz"):
        if name.endswith(ending):
            name = name[: -len(ending)]
            break
    return path.with_name(name + suffix)


def cmd_report(args: argparse.Namespace) -> int:
    from specviz.trace.io import open_trace
    from specviz.views import analyse
    from specviz.views.report import report_html

    out = _derived_out(args.trace, args.out, ".html")
    check_output_path(out, args.force)  # before the check: a bad output path fails now
    loaded = analyse(open_trace(args.trace), Path(args.trace).name)
    out.write_text(report_html(loaded, Path(args.trace).name), encoding="utf-8")
    first = loaded.report.first_violation
    where = f"; first violation at step {first.step}, row {first.row}" if first else ""
    print(f"{out}: {loaded.report.verdict}{where}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from specviz.analysis.check import check_trace
    from specviz.trace.io import open_trace
    from specviz.views.perfetto import export_perfetto

    out = _derived_out(args.trace, args.out, ".perfetto.json")
    check_output_path(out, args.force)
    trace = open_trace(args.trace)  # a Parquet trace streams, and so does the JSON written
    count = export_perfetto(trace, check_trace(trace), out)
    print(f"{out}: {count} trace events (open it in Perfetto's UI: ui.perfetto.dev, Open trace file)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from specviz.bench import run_from_args

    return run_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
