"""The rows of `specviz runs`, kept between scans in a file the user names (`--cache FILE`).

A CI history gains a file or two per run; re-checking hundreds of unchanged traces each time is
minutes of waste. A cached row is reused only when all of these still match:
- the file: its absolute path, size and modification time in nanoseconds (a rewrite changes them);
- the checker: a hash of the source of `specviz/analysis` and `specviz/trace`, so a specviz whose
  checks or loader changed re-checks everything instead of serving an old verdict.
Rows with an error are not cached (a file may be unreadable only for now). Nothing is written
unless a cache file is named; the file is replaced atomically, and a file that is not such a cache
is never overwritten.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specviz.analysis.runs import COLUMNS, RunRow
from specviz.errors import SpecvizError
from specviz.files import FileRefused, refuse_non_regular, umask_file_mode

CACHE_FORMAT = "specviz-runs-cache"
CACHE_VERSION = 1
MAX_CACHE_BYTES = 256 * 1024 * 1024  # ~1 KB a row: far more runs than a folder holds

Stamp = list[int] | None  # [size, mtime_ns]: as JSON keeps it


@functools.cache
def checker_fingerprint() -> str:
    """A hash of the code that decides a row: the loader and the checks."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for sub in ("analysis", "trace"):
        for file in sorted((package / sub).glob("*.py")):
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


class RunsCache:
    """Rows keyed by absolute path; `get` answers only for an unchanged file checked by this same code."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.entries: dict[str, dict[str, Any]] = self._load()
        self.hits = 0

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            refuse_non_regular(self.path)
        except FileRefused as exc:
            raise SpecvizError(f"--cache {exc}") from None
        if not self.path.exists():
            return {}
        try:
            if self.path.stat().st_size > MAX_CACHE_BYTES:
                raise SpecvizError(f"--cache {self.path}: over {MAX_CACHE_BYTES >> 20} MiB; not a runs cache?")
            data = json.loads(self.path.read_bytes())
        except (OSError, ValueError) as exc:
            raise SpecvizError(f"--cache {self.path}: not a runs cache, not overwriting it ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
            raise SpecvizError(f"--cache {self.path}: not a runs cache (no {CACHE_FORMAT!r}); not overwriting it")
        if data.get("version") != CACHE_VERSION or data.get("checker") != checker_fingerprint():
            return {}  # another specviz wrote it: its rows may say what this one would not
        entries = data.get("entries")
        return entries if isinstance(entries, dict) else {}

    def get(self, path: Path, name: str, stamp: Stamp) -> RunRow | None:
        """The cached row of `path` if `stamp` (taken before it is read) still matches, named as
        this scan names it."""
        entry = self.entries.get(os.path.abspath(path))
        if stamp is None or not isinstance(entry, dict) or entry.get("stamp") != stamp:
            return None
        saved = entry.get("row")
        if not isinstance(saved, dict) or set(saved) != set(COLUMNS):
            return None  # written with other columns: check again rather than guess
        self.hits += 1
        return RunRow(**{**saved, "file": name})

    def put(self, path: Path, row: RunRow, stamp: Stamp) -> None:
        """Keep `row` under the stamp taken before the file was read: a file rewritten while it
        was checked gets a new stamp, so the row is never served for content it did not see."""
        if row.error is None and stamp is not None:
            self.entries[os.path.abspath(path)] = {"stamp": stamp, "row": row.to_dict()}

    def row_of(self, path: Path, name: str, check: Callable[[Path, str], RunRow]) -> RunRow:
        """The cached row of an unchanged file, else `check(path, name)`'s, kept for next time."""
        stamp = stamp_of(path)
        row = self.get(path, name, stamp)
        if row is None:
            row = check(path, name)
            self.put(path, row, stamp)
        return row

    def save(self) -> None:
        """Replace the file atomically (a temp file beside it, renamed over it)."""
        body = {"format": CACHE_FORMAT, "version": CACHE_VERSION, "checker": checker_fingerprint()}
        payload = json.dumps({**body, "entries": self.entries}, separators=(",", ":"), allow_nan=False)
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=folder)
        except OSError as exc:
            raise SpecvizError(f"--cache {self.path}: cannot write ({exc.strerror or exc})") from None
        try:
            os.fchmod(fd, umask_file_mode())
            with os.fdopen(fd, "w") as handle:
                handle.write(payload)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def stamp_of(path: Path) -> Stamp:
    """[size, mtime_ns] of the file now; None for a file that cannot be stat'ed."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return [info.st_size, info.st_mtime_ns]
