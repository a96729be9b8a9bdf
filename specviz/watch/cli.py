"""`python -m specviz watch --out T -- python their_script.py [args]`: trace a script unmodified.
The script runs in this process (`runpy`) with its own `sys.argv`, every causal LM it builds hooked
(`autowatch`); when it ends, what was decoded is inferred from the calls (docs/watch-command.md)."""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from specviz.errors import SpecvizError
from specviz.startup import EXIT_INTERRUPTED
from specviz.trace.schema import LAYOUTS
from specviz.watch.autowatch import AutoWatch
from specviz.watch.vllm import session as vllm_session

PYTHONS = ("python", "python3")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="trace path (.json or .json.gz)")
    parser.add_argument("--name", default=None, help="the engine's name in the trace (default: the script's)")
    parser.add_argument("--layout", choices=LAYOUTS, default="unspecified", help="left-padded: also check it")
    parser.add_argument("--no-reference", action="store_true", help="skip the batch-1 greedy oracle")
    drafter = "the draft head's class (DraftHead or mypkg.heads.DraftHead): its input is checked"
    parser.add_argument("--drafter", metavar="CLASS", help=drafter)
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- python their_script.py [args]")


def script_argv(words: list[str]) -> tuple[str, list[str], Callable[[], Any], str]:
    """(path or module, its argv, its run as `__main__`, the folder its imports start from, as `python`
    would run it) from `[--] [python] script.py args` or `python -m mod args`."""
    if words[:1] == ["--"]:
        words = words[1:]
    if words and (Path(words[0]).name in PYTHONS or words[0] == sys.executable):
        words = words[1:]
    if not words:
        raise SpecvizError("watch: name the script to run, e.g. `-- python their_script.py`")
    if words[0] == "-m":
        if len(words) < 2:
            raise SpecvizError("watch: -m needs a module name")
        run = partial(runpy.run_module, words[1], run_name="__main__", alter_sys=True)
        return words[1], words[1:], run, os.getcwd()
    if not Path(words[0]).is_file():
        raise SpecvizError(f"watch: no such script: {words[0]}")
    run = partial(runpy.run_path, words[0], run_name="__main__")
    return words[0], list(words), run, os.path.dirname(os.path.abspath(words[0]))


def run_script(argv: list[str], run: Callable[[], Any], folder: str) -> int:
    """Run the script with its own argv; its exit status (a crash is 1, after its traceback; Ctrl-C 130)."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = argv
    try:
        sys.path.insert(0, folder)
        run()
        return 0
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception:  # the user's crash: shown as theirs, and the trace is still written
        traceback.print_exc()
        return 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def cmd_watch(args: argparse.Namespace) -> int:
    """Run the script under the hooks, write the trace; the script's exit status (or 2 for bad use)."""
    target, argv, run, folder = script_argv(list(args.script))
    if args.drafter is not None and not all(part.isidentifier() for part in args.drafter.split(".")):
        raise SpecvizError(
            f"watch: --drafter takes a class name such as DraftHead or pkg.mod.DraftHead, got {args.drafter!r}"
        )
    out = Path(args.out)
    watcher = AutoWatch(drafter=args.drafter)
    vllm_records = vllm_session.begin()  # vLLM's engines record their own steps (docs/vllm.md)
    watcher.install()
    status = run_script(argv, run, folder)  # whatever the script did: it returns a status
    watcher.uninstall()
    name, reference, complete = args.name or Path(target).stem, not args.no_reference, status == 0
    if vllm_session.finish(vllm_records, out, name, reference=reference, complete=complete):
        return status
    trace, notes = watcher.finish(out, name, args.layout, reference=reference, complete=complete)
    for note in notes:
        print(f"specviz watch: note: {note}", file=sys.stderr)
    h = trace.header
    draft = f", draft {_short(h.draft.name)}" if h.draft else ""
    draft += f", head {type(watcher.head).__name__}" if watcher.head is not None else ""
    vllm_session.announce(trace, out, f"target {_short(h.target.name)}{draft}", "sequences")
    return status


def _short(name: str) -> str:
    """A model path as its folder's name (the trace keeps it whole): one line stays readable."""
    return Path(name.rstrip("/\\")).name or name
