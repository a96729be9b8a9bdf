"""Who may read an upload: the session that made it (issue 23).

Gradio's upload request names no session: the browser and gradio_client post the file, get its path
back, and at once queue the event that loads it. So every upload is a ticket. `/upload` records one
per path it answers (`install_upload_claims` counts the paths it adds to the app's upload set), the
first event queued with that path takes the ticket for its session (only the uploader knows the path
then), and a handler reads a path only for a session holding a ticket for it. The file is deleted
once every ticket taken for it is read. Any other path (another visitor's upload, a download the app
cached, a file that never was) gets the one answer a missing file gets: nothing read, nothing
deleted, nothing said about whether it exists.

Two uploads of the same bytes under the same name share one path in Gradio's cache: each is a
ticket of its own, and the file stays until both are read.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from specviz.app import files
from specviz.app.serve import FILE_MAX_AGE_S
from specviz.errors import SpecvizError

UPLOAD_GONE = "this upload is not available (gone, or not uploaded in this page); upload the file again"
URL_REFUSED = "files are read only from an upload in this page; an address (http://, any link) is never fetched"
MAX_TRACKED_PATHS = 20_000  # uploads no event has claimed yet, remembered at once; the oldest go first
MAX_CLAIMS_PER_SESSION = 64  # claimed, unread uploads of one session; past it, its own oldest go
MAX_CLAIMED = 100_000  # claimed, unread uploads of every session: past it, a new claim is not taken


def _key(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(path)


class UploadLedger:
    """Per upload path: the tickets `/upload` handed out, and which sessions took them.

    Free tickets (uploaded, no event queued with them yet) are bounded by count and age, the oldest
    forgotten first. A claimed ticket is a queued visitor's: it is kept until read, until its
    session ends (`session_ended`: the tab closed), or until the file's own age limit. No flood of
    newer uploads pushes it out (issue 34): one session keeps at most `MAX_CLAIMS_PER_SESSION`
    (its own oldest go), and past `MAX_CLAIMED` in all a new claim is not taken."""

    def __init__(
        self,
        max_age_s: float = FILE_MAX_AGE_S,
        max_paths: int = MAX_TRACKED_PATHS,
        per_session: int = MAX_CLAIMS_PER_SESSION,
        max_claimed: int = MAX_CLAIMED,
    ) -> None:
        self.max_age_s = max_age_s
        self.max_paths = max_paths
        self.per_session = per_session
        self.max_claimed = max_claimed
        self._free: OrderedDict[str, list[float]] = OrderedDict()  # path -> [free tickets, last upload]
        self._held: dict[str, Counter[str]] = {}  # path -> session -> tickets taken, not yet read
        self._sessions: dict[str, OrderedDict[str, float]] = {}  # session -> its claimed paths, oldest first
        self._claimed = 0
        self._swept = time.monotonic()
        self._lock = threading.Lock()
        self.refused = 0

    def uploaded(self, paths: Iterable[str | os.PathLike[str]]) -> None:
        """`/upload` answered these paths: one ticket each."""
        now = time.monotonic()
        with self._lock:
            for path in paths:
                key = _key(path)
                free = self._free.pop(key, None) or [0, now]
                self._free[key] = [free[0] + 1, now]  # newest last
            self._forget_free(now)
            if now - self._swept > 60:
                self._forget_old_claims(now)

    def claim(self, session: str | None, paths: Iterable[str | os.PathLike[str]]) -> None:
        """An event of `session` was queued with these paths: it takes a free ticket of each."""
        if not session:
            return
        now = time.monotonic()
        with self._lock:
            for path in paths:
                key = _key(path)
                free = self._free.get(key)
                if free is None or free[0] <= 0 or self._claimed >= self.max_claimed:
                    continue
                free[0] -= 1
                if free[0] <= 0:
                    del self._free[key]
                self._held.setdefault(key, Counter())[session] += 1
                self._claimed += 1
                mine = self._sessions.setdefault(session, OrderedDict())
                mine[key] = now
                mine.move_to_end(key)
                while len(mine) > self.per_session:  # a session flooding itself loses its own oldest
                    self._drop(session, next(iter(mine)))

    def owns(self, session: str | None, path: str | os.PathLike[str]) -> bool:
        with self._lock:
            held = self._held.get(_key(path))
            owned = bool(session) and held is not None and held.get(session or "", 0) > 0
            self.refused += not owned
            return owned

    def release(self, session: str, path: str | os.PathLike[str]) -> bool:
        """`session` read its upload: its ticket is spent. True when no ticket is left (delete it)."""
        with self._lock:
            key = _key(path)
            held = self._held.get(key)
            if held is not None and held.get(session, 0) > 0:
                held[session] -= 1
                self._claimed -= 1
                if held[session] <= 0:
                    self._forget_claim(session, key)
            return self._unticketed(key)

    def session_ended(self, session: str | None) -> list[str]:
        """`session`'s tab closed: its unread tickets go. The paths no ticket is left for."""
        if not session:
            return []
        with self._lock:
            keys = list(self._sessions.get(session, ()))
            for key in keys:
                self._drop(session, key)
            return [key for key in keys if self._unticketed(key)]

    def _drop(self, session: str, key: str) -> None:
        held = self._held.get(key)
        if held is not None:
            self._claimed -= held.get(session, 0)
            held[session] = 0
        self._forget_claim(session, key)

    def _forget_claim(self, session: str, key: str) -> None:
        held = self._held.get(key)
        if held is not None:
            held.pop(session, None)
            if not held:
                del self._held[key]
        mine = self._sessions.get(session)
        if mine is not None:
            mine.pop(key, None)
            if not mine:
                del self._sessions[session]

    def _unticketed(self, key: str) -> bool:
        return key not in self._held and key not in self._free

    def _forget_free(self, now: float) -> None:
        """Free tickets never claimed (a closed tab, an upload never used): oldest first, by age
        (the file's own limit) and by count."""
        while self._free:
            key, (_count, since) = next(iter(self._free.items()))
            if now - since <= self.max_age_s and len(self._free) <= self.max_paths:
                break
            del self._free[key]

    def _forget_old_claims(self, now: float) -> None:
        """Claims never read (a replaced event, a client gone without closing a tab) go with the
        file's own age limit: Gradio deletes the file then."""
        self._swept = now
        for session, mine in list(self._sessions.items()):
            for key, since in list(mine.items()):
                if now - since > self.max_age_s:
                    self._drop(session, key)


UPLOADS = UploadLedger()  # every session's uploads, this process


def read_upload(path: str | None, session: str | None, max_bytes: int, too_big: str) -> bytes:
    """The bytes of `session`'s own upload at `path`, read once, the file deleted when its last
    ticket is spent. Anything else: `UPLOAD_GONE`, before the path is looked at."""
    if not path:
        raise SpecvizError("no file uploaded")
    file = Path(path)
    if not UPLOADS.owns(session, file):
        raise SpecvizError(UPLOAD_GONE)
    try:
        try:
            size = file.stat().st_size
        except OSError:  # gone, or never there: one message, no server path
            raise SpecvizError(UPLOAD_GONE) from None
        if size > max_bytes:
            raise SpecvizError(too_big.format(name=file.name, mb=size / 1e6, limit=max_bytes // 2**20))
        try:
            return file.read_bytes()
        except OSError:
            raise SpecvizError(UPLOAD_GONE) from None
    finally:  # read once, then gone: uploads never pile up in the Space's disk
        if UPLOADS.release(session or "", file):
            files.delete_upload(file)


# ----------------------------------------------------------------------------- wiring


class _CountingSet(set):
    """Gradio's set of uploaded files (`Blocks.upload_file_set`), also telling the ledger."""

    def __init__(self, items: Iterable[Any], ledger: UploadLedger) -> None:
        super().__init__(items)
        self.ledger = ledger

    def update(self, *others: Iterable[Any]) -> None:  # type: ignore[override]
        for paths in others:
            paths = list(paths)
            self.ledger.uploaded(paths)
            super().update(paths)


def install_upload_claims(demo: Any, ledger: UploadLedger = UPLOADS) -> bool:
    """Count `/upload`'s answers (it adds them to `demo.upload_file_set`) and let each queued event
    claim the uploads it names (a wrap of the queue's `push`, as `serve.install_gate`). An event
    whose file arguments name an address instead of an upload is refused there, before Gradio
    would fetch it (`refuse_remote_files`). Gradio 6.x internals; False if they are absent, and
    then every upload is refused: no file is readable."""
    refuse_remote_files(demo)
    queue = getattr(demo, "_queue", None)
    uploads = getattr(demo, "upload_file_set", None)
    if queue is None or not hasattr(queue, "push") or not isinstance(uploads, set):
        return False
    counting = _CountingSet(uploads, ledger)
    demo.temp_file_sets = [counting if s is uploads else s for s in getattr(demo, "temp_file_sets", [])]
    demo.upload_file_set = counting
    original = queue.push

    async def push(body: Any, request: Any, username: str | None) -> Any:
        paths = _file_paths(getattr(body, "data", None))
        if any(map(is_address, paths)):
            return False, URL_REFUSED, "error"
        ledger.claim(getattr(body, "session_hash", None), paths)
        return await original(body, request, username)

    queue.push = push
    demo.unload(_session_end_handler(ledger))  # a closed tab's unread tickets go, and their files
    return True


def _session_end_handler(ledger: UploadLedger) -> Any:
    import gradio as gr

    def session_ended(request: gr.Request) -> None:
        for key in ledger.session_ended(getattr(request, "session_hash", None)):
            files.delete_upload(key)

    # The annotation is a string here (`from __future__ import annotations`) naming a local import,
    # which Gradio cannot resolve: it would take `request` for an input and warn twice at start.
    session_ended.__annotations__ = {"request": gr.Request, "return": None}
    return session_ended


# ----------------------------------------------------------------------------- no outbound fetch

# A scheme (`http:`, `ftp:`, `file:`, `data:`...) or a network path (`//host`, `\\host`): what a
# file argument may carry instead of an upload's path. Uploads are absolute paths in Gradio's cache.
_ADDRESS = re.compile(r"\s*(?:[A-Za-z][A-Za-z0-9+.\-]*:|//|\\\\)")


def is_address(path: Any) -> bool:
    """Whether a file argument names an address (a URL of any scheme) rather than a file."""
    return isinstance(path, str) and _ADDRESS.match(path) is not None and not _windows_drive(path)


def _windows_drive(path: str) -> bool:
    return len(path) > 2 and path[1] == ":" and path[0].isalpha() and path[2] in "\\/"


def refuse_remote_files(demo: Any, public: bool | None = None) -> None:
    """No file argument makes the server connect anywhere (issue 34). Gradio downloads a file
    argument whose path is an `http(s)://` URL (`Block.async_move_resource_to_block_cache`, with a
    guard that only spares private and loopback addresses) before any handler runs: every
    component's cache step refuses an address instead, for every route (queued or not). In public
    mode Gradio's fetch itself (`processing_utils.async_ssrf_protected_get`, also behind image,
    audio and run-history assets) is replaced by the same refusal: nothing a visitor sends reaches
    the network."""
    from gradio import processing_utils
    from gradio.blocks import Block

    for method in ("async_move_resource_to_block_cache", "move_resource_to_block_cache"):
        original = getattr(Block, method, None)
        if original is None or getattr(original, "refuses_addresses", False):
            continue
        setattr(Block, method, _refusing(original, method.startswith("async")))
    if public if public is not None else _public():
        names = ("async_ssrf_protected_get", "async_ssrf_protected_download", "ssrf_protected_download")
        for name in (*names, "save_url_to_cache"):
            original = getattr(processing_utils, name, None)
            if original is not None and not getattr(original, "refuses_addresses", False):
                setattr(processing_utils, name, _no_fetch(original))


def _refusing(original: Any, is_async: bool) -> Any:
    from gradio.exceptions import Error

    if is_async:

        async def guarded(self: Any, url_or_file_path: Any) -> Any:
            if is_address(str(url_or_file_path) if url_or_file_path is not None else None):
                raise Error(URL_REFUSED, print_exception=False)
            return await original(self, url_or_file_path)

    else:

        def guarded(self: Any, url_or_file_path: Any) -> Any:  # type: ignore[misc]
            if is_address(str(url_or_file_path) if url_or_file_path is not None else None):
                raise Error(URL_REFUSED, print_exception=False)
            return original(self, url_or_file_path)

    guarded.refuses_addresses = True  # type: ignore[attr-defined]
    guarded.__doc__ = original.__doc__
    guarded.__wrapped__ = original  # type: ignore[attr-defined]  # Gradio's own, for `inspect.unwrap`
    return guarded


def _no_fetch(original: Any) -> Any:
    """Gradio's URL fetch, in public mode: refused before any connection. The patch is process-wide
    and stays; `__wrapped__` keeps Gradio's own function reachable (`inspect.unwrap`)."""

    def refused(*_args: Any, **_kwargs: Any) -> Any:
        from gradio.exceptions import Error

        raise Error(URL_REFUSED, print_exception=False)

    refused.refuses_addresses = True  # type: ignore[attr-defined]
    refused.__wrapped__ = original  # type: ignore[attr-defined]
    return refused


def _public() -> bool:
    from specviz.app.serve import public_mode

    return public_mode()


def _file_paths(data: Any) -> list[str]:
    """Every `FileData` path in an event's input values."""
    found: list[str] = []
    stack = [data]
    while stack and len(found) < 64:
        value = stack.pop()
        if isinstance(value, dict):
            if isinstance(value.get("path"), str):  # a FileData (its "meta" is the client's word, not checked)
                found.append(value["path"])
            else:
                stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value[:64])
    return found
