"""How many CPU threads torch uses for `record` and `bench`.

The models specviz runs on a CPU are small (the embedded pair, Gemma-3-270M): a matmul of one
decode step is too short for several threads to pay their synchronisation, and on a machine that
is busy with anything else torch's default (one thread per core) makes every thread wait for the
slowest. Measured on a shared 2-core machine (`record --fault stale-kv --num-prompts 16`): with
no load of ours (load average 7-10 from others) 24 s with 1 thread, 104 s with 2, 259 s with
torch's default; with two busy loops added, 122 s, 586 s and 507 s. So one thread is the
default; `--threads N` asks for more, `--threads 0` keeps torch's own.
"""

from __future__ import annotations

import argparse

from specviz.errors import SpecvizError

DEFAULT_THREADS = 1
TORCH_DEFAULT = 0  # `--threads 0`: leave torch's own choice (one thread per physical core)


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help="torch CPU threads; 0 keeps torch's default (one per core). One is fastest for small models "
        "and on a shared machine",
    )


def set_threads(threads: int | None) -> int:
    """Apply `--threads` and return the count torch now uses; None or 0 keeps torch's default."""
    import torch

    if threads is not None and threads < 0:
        raise SpecvizError(f"--threads must be 0 (torch's default) or more, got {threads}")
    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()
