"""Hostile trace files for the local readers (`specviz check`, `convert`, `runs`, `app.py --trace`):
small files whose own declared sizes say they would inflate far past themselves (issue 34). A CI
gate that checks artifacts of other jobs reads such files."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tools.attacks.files import token_bomb_file


def _parquet_parts(folder: Path, rows: int) -> tuple[pa.Table, dict[bytes, bytes]]:
    """A real trace's table, its rows repeated to `rows`, and its footer."""
    from specviz.trace.columnar import save_parquet
    from specviz.trace.synthetic import synthetic_trace

    path = save_parquet(synthetic_trace(4, 2, 2, 6), folder / "seed.parquet")
    table = pq.read_table(path)
    footer = pq.ParquetFile(path).metadata.metadata
    path.unlink()
    if rows <= table.num_rows:
        return table, dict(footer)
    copies = -(-rows // table.num_rows)
    return pa.concat_tables([table] * copies).slice(0, rows), dict(footer)


def dictionary_bomb_file(folder: Path, rows: int = 20_000, text_bytes: int = 1 << 20) -> Path:
    """`finish_reason` dictionary-encoded: one `text_bytes` string (1 MB) used by every one of
    `rows` rows. The file is ~1 MB; read as strings it is `rows` x 1 MB (20 GB)."""
    table, footer = _parquet_parts(folder, rows)
    column = table.schema.get_field_index("finish_reason")
    bomb = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["x" * text_bytes]))
    table = table.set_column(column, pa.field("finish_reason", bomb.type), bomb)
    path = folder / "dictionary-bomb.parquet"
    # No Arrow schema stored: a reader sees a plain string column with a dictionary page.
    with pq.ParquetWriter(path, table.schema, store_schema=False) as writer:
        writer.write_table(table, row_group_size=rows)
        writer.add_key_value_metadata(footer)
    return path


def footer_bomb_file(folder: Path, objects: int = 20_000_000) -> Path:
    """The specviz footer: a small gzip inflating to `objects` empty JSON objects (~60 MB of text,
    ~1.3 GB parsed)."""
    table, footer = _parquet_parts(folder, 0)
    body = json.loads(gzip.decompress(footer[b"specviz"]))
    head = json.dumps({**body, "junk": "__JUNK__"}, separators=(",", ":")).split('"__JUNK__"')
    stream = gzip.compress((head[0] + "[" + "{}," * (objects - 1) + "{}]" + head[1]).encode(), 9)
    path = folder / "footer-bomb.parquet"
    pq.write_table(table.replace_schema_metadata({**footer, b"specviz": stream}), path)
    return path


def bad_row_group_file(folder: Path) -> Path:
    """A real Parquet trace whose row group's bytes are damaged: its error must not show the path."""
    table, footer = _parquet_parts(folder, 0)
    path = folder / "bad-row-group.parquet"
    pq.write_table(table.replace_schema_metadata(footer), path, compression="zstd")
    data = bytearray(path.read_bytes())
    for i in range(8, min(len(data) // 3, 4096), 7):  # the first column chunks: the pages, not the footer
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    return path


def json_bomb_file(folder: Path, inflated_mib: int = 400) -> Path:
    """A gzip JSON trace inflating to `inflated_mib` MiB of tokens (~3 MB on disk)."""
    return token_bomb_file(folder, inflated_mib)


def local_files(quick: bool = False) -> dict[str, Callable[[Path], Path]]:
    """The hostile local files by name (quick: the gzip inflates to 128 MiB, past the limit too)."""
    inflated = 128 if quick else 400
    return {
        "dictionary page of a 1 MB string x 20,000 rows": dictionary_bomb_file,
        "footer of 20M empty JSON objects": footer_bomb_file,
        f"gzip JSON inflating to {inflated} MiB": lambda folder: json_bomb_file(folder, inflated),
        "damaged row group": bad_row_group_file,
    }


LOCAL_GOAL_PEAK_MB = 2048  # issue 34: a hostile file is refused (or read) within 2 GB
LOCAL_KILL_MB = 4096  # an older checkout's reader is stopped here: the machine must survive it


def check_peak(root: Path, path: Path, timeout: float) -> tuple[int, str, float]:
    """`specviz check FILE` of the checkout at `root`, in a process of its own: exit status, last
    line of stderr, and peak RSS in MB (its address space capped at LOCAL_KILL_MB)."""
    import os
    import subprocess
    import sys
    import threading
    import time

    # A small Python caps its address space, then becomes the check: a child forked from this big
    # process would start its peak RSS at ours.
    start = (
        "import os, resource, sys; limit = int(sys.argv[1]) << 20; "
        "resource.setrlimit(resource.RLIMIT_AS, (limit, limit)); os.execv(sys.executable, sys.argv[2:])"
    )
    command = [sys.executable, "-I", "-S", "-c", start, str(LOCAL_KILL_MB), sys.executable, "-m", "specviz"]
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.Popen(
        [*command, "check", str(path)], cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    peak = [0.0]

    def watch() -> None:  # the check's own high-water mark (VmHWM starts again at exec)
        while proc.poll() is None:
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
                if "\nName:\tpython" in "\n" + status and "VmHWM:" in status:
                    peak[0] = max(peak[0], int(status.split("VmHWM:")[1].split()[0]) / 1024)
            except (OSError, ValueError, IndexError):
                pass
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    watcher.join()
    lines = err.decode(errors="replace").strip().splitlines()
    return proc.returncode, (lines[-1] if lines else ""), peak[0]
