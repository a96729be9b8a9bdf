"""Writing to the terminal: output a reader may stop reading early (`| head`) is not an error."""

from __future__ import annotations

import os
import sys


def print_to_pipe(text: str) -> None:
    """Print; a reader that stopped early (`| head`) is not an error, the verdict still is."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit and would report that failure too: point the
        # descriptor at /dev/null first, so the exit is silent and keeps our exit code.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
