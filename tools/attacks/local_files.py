"""Hostile trace files for the local readers (`specviz check`, `convert`, `runs`, `app.py --trace`):
small files whose own declared sizes say they would inflate far past themselves (issue 34). A CI
gate that checks artifacts of other jobs reads such files."""

from __future__ import annotations

import gzip
import json
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


LOCAL_FILES = {
    "dictionary page of a 1 MB string x 20,000 rows": dictionary_bomb_file,
    "footer of 20M empty JSON objects": footer_bomb_file,
    "gzip JSON inflating to 400 MiB": json_bomb_file,
    "damaged row group": bad_row_group_file,
}
