"""What must happen before `specviz` imports anything heavy.

Ctrl-C while the `specviz` command is still importing (torch takes seconds) exits 130 quietly.

Python turns SIGINT into KeyboardInterrupt, and one raised inside `import torch` prints a long
traceback. Only the command line wants a quiet exit: `specviz.cli.main_exit` puts the default
handler back as soon as it runs, so the engine can turn Ctrl-C into a partial trace, and a library
user (a test, the app, a notebook) never sees this handler at all.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

EXIT_INTERRUPTED = 130


def _is_cli_start_up() -> bool:
    """`python [flags] -m specviz ...` or the `specviz` console script, judged by the real argv."""
    argv = list(getattr(sys, "orig_argv", None) or sys.argv)
    if len(argv) > 1 and Path(argv[1]).name == "specviz":
        return True
    return any(a == "-m" and b == "specviz" for a, b in zip(argv, argv[1:]))


def _interrupted(signum: int, frame: object) -> None:
    sys.stderr.write("specviz: interrupted\n")
    os._exit(EXIT_INTERRUPTED)  # nothing has been written yet: there is nothing to clean up


def quiet_interrupt_while_starting() -> None:
    """Install the quiet handler for the command line's start-up only (main thread only)."""
    if _is_cli_start_up() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        try:
            signal.signal(signal.SIGINT, _interrupted)
        except ValueError:  # not the main thread: leave signals alone
            pass


# Arrow's default allocator (mimalloc) commits its first arena whole when it starts: about 18 MB
# of resident memory that a check of a 114k row-step trace never uses (peak RSS of `specviz check`
# 163 -> 144 MB, same CPU time; 323 -> 318 MB at 1.1M row-steps). It reads the setting once, when
# pyarrow first allocates, so it is set before any specviz module imports pyarrow.
LAZY_ARENA = ("MIMALLOC_ARENA_EAGER_COMMIT", "0")


def lazy_arrow_arenas() -> None:
    """Let mimalloc commit arena memory as it is used, unless pyarrow is loaded already or the
    user chose a value (theirs wins)."""
    if "pyarrow" not in sys.modules:
        os.environ.setdefault(*LAZY_ARENA)
