"""What a file that is no trace is, read from its first bytes: "a PNG image" says more than
"not UTF-8 text at byte 0" to someone who picked the wrong file."""

from __future__ import annotations

# Leading bytes -> what a person calls the file. Only kinds people mistake for a trace in a
# file picker or a shell's tab completion: images, documents, archives, notebooks' neighbours.
MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"%PDF-", "a PDF document"),
    (b"PK\x03\x04", "a zip archive (or a file packed as one: .docx, .xlsx, .whl)"),
    (b"BZh", "a bzip2 file"),
    (b"\xfd7zXZ\x00", "an xz file"),
    (b"(\xb5/\xfd", "a zstd file"),
    (b"\x7fELF", "a program (ELF executable)"),
    (b"SQLite format 3\x00", "an SQLite database"),
)
TRACE_SUFFIXES = (".json", ".json.gz", ".parquet")  # what save_trace writes and the app opens
TRACE_FILES = "a trace is JSON (.json or .json.gz) or Parquet (.parquet), as `specviz record --out` writes it"


def file_kind(head: bytes) -> str | None:
    """What the file starting with `head` is, when it is a kind people mistake for a trace."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "a WebP image"
    return next((kind for magic, kind in MAGIC if head.startswith(magic)), None)


def not_a_trace(source: str, head: bytes) -> str | None:
    """The one-line refusal for a known non-trace file, or None (the parser then says what it finds)."""
    kind = file_kind(head)
    return f"{source}: {kind}, not a specviz trace: {TRACE_FILES}" if kind else None


def check_trace_name(path: str) -> str | None:
    """Why a trace may not be written to `path` (a name the app would refuse), or None."""
    if str(path).lower().endswith(TRACE_SUFFIXES):
        return None
    return (
        f"{path}: a trace file's name ends in .json, .json.gz or .parquet (the app's upload reads .json "
        "and .json.gz; python app.py --trace opens all three)"
    )
