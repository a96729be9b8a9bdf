"""Reading and writing user-named files without surprises: no hangs, no lost runs, no clobbering.

- Inputs must be regular files with a size: a FIFO, a device or a /proc file (which reports size 0
  and may block, like /proc/kmsg) is refused before anything waits on it.
- An output path is checked before any compute: absent or a regular file, in a directory where a
  file can be created and written. A device node, a directory or a socket is never replaced.
- Files are created with the mode the umask gives (0666 less the umask), like any shell redirect.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import io
import os
import stat
import tempfile
from pathlib import Path

PROBE_BYTES = 64 * 1024  # written and synced once before a run: a full disk shows up now, not after


class FileRefused(ValueError):
    """A path that is not a readable regular file, or not a writable output; one-line message."""


class InflatesTooFar(ValueError):
    """Gzip bytes that inflate past a limit; `size` is how far they got before we stopped."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"gzip inflates past {limit} bytes")
        self.size = size


def inflate_bounded(raw: bytes, limit: int) -> bytes:
    """Gunzip `raw` in 1 MiB chunks, stopping past `limit` bytes: a decompression bomb costs at
    most `limit` of memory. Corrupt input raises what gzip raises (OSError, EOFError, zlib.error)."""
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
        while chunk := stream.read(1 << 20):
            out.write(chunk)
            if out.tell() > limit:
                raise InflatesTooFar(out.tell(), limit)
    return out.getvalue()


def read_regular_file(path: str | os.PathLike[str], limit: int, what: str = "file") -> bytes:
    """The bytes of a regular, non-empty file of at most `limit` bytes; anything else is refused.

    Opened non-blocking and checked with fstat on the open descriptor, so a FIFO swapped in after
    a check cannot block us, and read with a bound, so a file that grows while read cannot either.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FileRefused(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise FileRefused(f"{path}: is a directory, not a {what}") from None
    except OSError as exc:
        raise FileRefused(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        _check_regular(path, os.fstat(fd), limit, what)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise FileRefused(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise FileRefused(f"{path}: {what} grew past the {limit} byte limit while being read")
    return data


def _check_regular(path: Path, info: os.stat_result, limit: int, what: str) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise FileRefused(f"{path}: is a directory, not a {what}")
    if not stat.S_ISREG(info.st_mode):
        raise FileRefused(f"{path}: not a regular file (a device, pipe or socket); refusing to read it")
    if info.st_size == 0:
        # Empty, or a kernel file (/proc) that reports no size and may block or never end.
        raise FileRefused(f"{path}: empty {what} (or a special file that reports no size)")
    if info.st_size > limit:
        raise FileRefused(f"{path}: {what} is {info.st_size} bytes, over the {limit} byte limit")


def umask_file_mode() -> int:
    """0666 less the process umask, read without changing it where Linux tells (other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def refuse_non_regular(path: Path) -> None:
    """Refuse to replace anything at `path` that is not a regular file (symlinks are followed)."""
    if not os.path.lexists(path):
        return
    try:
        info = path.stat()
    except OSError as exc:  # a dangling symlink, a permission problem
        raise FileRefused(f"{path}: exists but cannot be inspected ({exc.strerror or exc}); not replacing it") from None
    if not stat.S_ISREG(info.st_mode):
        raise FileRefused(f"{path}: exists and is not a regular file; refusing to replace it")


def check_output_path(path: Path, force: bool) -> None:
    """Everything that could make the final write fail, checked before any compute.

    Creates the missing parent folders (as the final write would) and writes a probe file there,
    so a read-only, missing or full location fails now, in one line, instead of after the run.
    """
    refuse_non_regular(path)
    if path.exists() and not force:
        raise FileRefused(f"{path}: exists; pass --force to overwrite it")
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FileRefused(f"{folder}: cannot create the output folder ({exc.strerror or exc})") from None
    if not folder.is_dir():
        raise FileRefused(f"{folder}: not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
    except OSError as exc:
        raise FileRefused(f"{folder}: cannot write there ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(b"\0" * PROBE_BYTES)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        raise FileRefused(f"{folder}: cannot write there ({exc.strerror or exc})") from None
    finally:
        Path(probe).unlink(missing_ok=True)


def beside(path: Path, tag: str) -> Path:
    """A free name next to `path`: `name.<tag>-<time>.json.gz` for `name.json.gz`."""
    name = path.name
    suffix = "".join(s for s in path.suffixes if s in (".json", ".gz"))
    stem = name[: -len(suffix)] if suffix and name.endswith(suffix) else name
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    candidate = path.with_name(f"{stem}.{tag}-{stamp}{suffix}")
    n = 1
    while os.path.lexists(candidate):
        n += 1
        candidate = path.with_name(f"{stem}.{tag}-{stamp}-{n}{suffix}")
    return candidate
