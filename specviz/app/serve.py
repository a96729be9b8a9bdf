"""What the app needs to be a safe public Space: public mode, a fair live-run lane, cleanup, memory.

- Public mode (env `SPACE_ID` set, or `python app.py --public`): live runs use the bundled model
  pair only (the model fields are hidden, and the server refuses any other path a client sends,
  with one message that says nothing about the path), with smaller prompt and token caps.
- The live-run lane: a visitor (browser session) has at most one live run queued or running, and
  at most `MAX_PENDING_LIVE` wait in all. Both are refused when the event is *queued*, not when it
  would run, so a flood of live runs never fills Gradio's queue: loading and inspecting traces
  keep their own lane and never see "Queue is full" because of live runs.
- Files: uploads are deleted once read; live-run traces live in one folder, pruned by age.
- Memory: after a session's state is dropped, freed memory is handed back to the system.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import gc
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

LIVE_CONCURRENCY_ID = "live-run"
MAX_PENDING_LIVE = 8  # live runs queued or running, all visitors together
PENDING_EXPIRY_S = 30 * 60  # a pending mark whose run never reported back (client vanished)
SESSION_TTL_S = 30 * 60  # a session's loaded runs are dropped this long after their last change
FILE_MAX_AGE_S = 30 * 60  # uploads Gradio kept and live-run traces are deleted after this long

# Live-run bounds: local use (one user's machine) and public use (a shared 2-core Space).
LOCAL_LIMITS = {"batch_size": (1, 32), "draft_k": (1, 8), "max_new_tokens": (1, 256), "num_prompts": (1, 64)}
PUBLIC_LIMITS = {"batch_size": (1, 8), "draft_k": (1, 8), "max_new_tokens": (1, 64), "num_prompts": (1, 16)}
PUBLIC_PROMPT_CHARS = 500  # per own prompt, public mode
LOCAL_PROMPT_CHARS = 20_000

BUSY_MESSAGE = "live runs are busy right now ({count} waiting); loading and inspecting traces still work: retry later"
ONE_RUN_MESSAGE = "you already have a live run queued or running; wait for it to finish"
PUBLIC_MODELS_MESSAGE = "this public app runs the bundled model pair only; run specviz locally for other models"


def public_mode(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> bool:
    """On a Hugging Face Space (it sets SPACE_ID) or when asked with --public."""
    argv = sys.argv[1:] if argv is None else argv
    environ = os.environ if environ is None else environ
    return bool(environ.get("SPACE_ID")) or "--public" in argv


def live_limits(public: bool) -> dict[str, tuple[int, int]]:
    return PUBLIC_LIMITS if public else LOCAL_LIMITS


def prompt_char_limit(public: bool) -> int:
    return PUBLIC_PROMPT_CHARS if public else LOCAL_PROMPT_CHARS


def public_models_only(target: str, draft: str, bundled: tuple[str, str]) -> None:
    """Refuse, with one message for every case, a model that is not the bundled pair.

    The message never depends on the path (whether it exists, is a hub ID or a file), so the
    server's file system cannot be probed through it, and nothing is downloaded.
    """
    from specviz.errors import SpecvizError

    allowed_target, allowed_draft = bundled
    if (target or "").strip() not in ("", allowed_target) or (draft or "").strip() not in ("", allowed_draft):
        raise SpecvizError(PUBLIC_MODELS_MESSAGE)


# ----------------------------------------------------------------------------- the live-run lane


class LiveRunGate:
    """Who has a live run queued or running, checked when a live-run event asks to be queued."""

    def __init__(self, max_pending: int = MAX_PENDING_LIVE, expiry_s: float = PENDING_EXPIRY_S) -> None:
        self.max_pending = max_pending
        self.expiry_s = expiry_s
        self._pending: dict[str, float] = {}  # session hash -> when its run was queued
        self._lock = threading.Lock()

    def admit(self, session: str) -> str | None:
        """Mark `session` as having a live run; the reason to refuse it instead, if any."""
        now = time.monotonic()
        with self._lock:
            for key, since in list(self._pending.items()):
                if now - since > self.expiry_s:
                    del self._pending[key]
            if session in self._pending:
                return ONE_RUN_MESSAGE
            if len(self._pending) >= self.max_pending:
                return BUSY_MESSAGE.format(count=len(self._pending))
            self._pending[session] = now
            return None

    def done(self, session: str | None) -> None:
        if session is not None:
            with self._lock:
                self._pending.pop(session, None)

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)


def install_gate(demo: Any, gate: LiveRunGate, concurrency_id: str = LIVE_CONCURRENCY_ID) -> bool:
    """Wrap the queue's `push` so live-run events are admitted (or refused) before they queue.

    Gradio has no public hook at queueing time, so this wraps `Queue.push` of this app's queue
    (gradio 6.x). If that internal changes, the app still runs with per-session checks inside
    the handler only; the return value says whether the wrap is in place.
    """
    queue = getattr(demo, "_queue", None)
    original = getattr(queue, "push", None)
    if queue is None or original is None:
        return False
    from gradio import route_utils

    async def push(body: Any, request: Any, username: str | None) -> Any:
        try:
            fn = route_utils.get_fn(demo, None, body)
        except Exception:  # noqa: BLE001 - let Gradio report a bad request its own way
            return await original(body, request, username)
        if getattr(fn, "concurrency_id", None) == concurrency_id:
            session = body.session_hash or _client_key(request)
            refusal = gate.admit(session)
            if refusal:
                return False, refusal, "error"
            accepted = await original(body, request, username)
            if not accepted[0]:
                gate.done(session)
            return accepted
        return await original(body, request, username)

    queue.push = push
    return True


def _client_key(request: Any) -> str:
    """A visitor without a session hash: the first forwarded address, else the peer's."""
    headers = getattr(request, "headers", {}) or {}
    forwarded = headers.get("x-forwarded-for", "")
    if forwarded:
        return "ip:" + forwarded.split(",")[0].strip()
    client = getattr(request, "client", None)
    return "ip:" + (getattr(client, "host", None) or "unknown")


# ----------------------------------------------------------------------------- files and memory


def gradio_temp_root(root: str | os.PathLike[str] | None = None) -> Path:
    """Gradio's folder for uploads and downloads: `root` if given, else where Gradio puts them."""
    return Path(root or os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")


def delete_upload(path: str | os.PathLike[str], uploads_root: str | os.PathLike[str] | None = None) -> None:
    """Delete an uploaded file once read, but only inside Gradio's upload folder (never a user path)."""
    root = gradio_temp_root(uploads_root)
    file = Path(path)
    try:
        resolved, base = file.resolve(), root.resolve()
    except OSError:
        return
    if base in resolved.parents:
        resolved.unlink(missing_ok=True)
        if resolved.parent != base:
            try:
                resolved.parent.rmdir()  # Gradio puts each upload in a folder of its own
            except OSError:
                pass


ABANDONED_UPLOAD_AGE_S = 5 * 60  # a temp file Gradio never moved into an upload folder


def sweep_abandoned_uploads(
    root: str | os.PathLike[str] | None = None, min_age_s: float = ABANDONED_UPLOAD_AGE_S
) -> int:
    """Delete the temp files an upload Gradio refused (over the size cap) leaves in its root.

    Gradio streams an upload into a `tmp*` file at the top of its temp folder and moves it into
    a folder of its own once accepted; a refused one stays there, empty, and Gradio's own cache
    cleanup does not know it. Only such top-level `tmp*` files older than `min_age_s` go.
    """
    folder = gradio_temp_root(root)
    now, removed = time.time(), 0
    for child in list(folder.iterdir()) if folder.is_dir() else []:
        try:
            if child.name.startswith("tmp") and child.is_file() and now - child.stat().st_mtime > min_age_s:
                child.unlink()
                removed += 1
        except OSError:
            continue
    return removed


def start_sweeper(every_s: float = 60.0) -> threading.Thread:
    """Sweep abandoned uploads every `every_s` seconds, for as long as the server runs."""

    def loop() -> None:
        while True:
            time.sleep(every_s)
            sweep_abandoned_uploads()

    thread = threading.Thread(target=loop, name="specviz-upload-sweeper", daemon=True)
    thread.start()
    return thread


class LiveFolder:
    """One folder for every live run's trace, pruned by age: nothing accumulates in /tmp."""

    def __init__(self, max_age_s: float = FILE_MAX_AGE_S) -> None:
        self.max_age_s = max_age_s
        self.path = Path(tempfile.mkdtemp(prefix="specviz-live-"))
        atexit.register(self.remove)  # a stopped server leaves nothing in /tmp

    def new_file(self, name: str) -> Path:
        self.prune()
        folder = Path(tempfile.mkdtemp(dir=self.path))
        return folder / name

    def prune(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        removed = 0
        for child in list(self.path.iterdir()) if self.path.exists() else []:
            try:
                if now - child.stat().st_mtime > self.max_age_s:
                    shutil.rmtree(child, ignore_errors=True)
                    removed += 1
            except OSError:
                continue
        return removed

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


_LIBC: Any = None


def release_memory(_value: Any = None) -> None:
    """Collect, then hand freed heap back to the system (glibc keeps it otherwise: RSS never falls).

    Usable as a `gr.State(delete_callback=...)`: it runs when a session's state expires.
    """
    global _LIBC
    gc.collect()
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        _LIBC = ctypes.CDLL(name) if name else False
    trim: Callable[[int], int] | None = getattr(_LIBC, "malloc_trim", None) if _LIBC else None
    if trim is not None:
        trim(0)
