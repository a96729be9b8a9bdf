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


OWNER_MARKER = ".specviz-owner"  # in every temp folder the app makes: "<pid> <process start time>"
LIVE_PREFIX = "specviz-live-"
GRADIO_PREFIX = "specviz-gradio-"


def _process_start(pid: int) -> str:
    """The process's start time (clock ticks since boot): a reused PID has another one."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def owned_folder(prefix: str, parent: str | os.PathLike[str] | None = None) -> Path:
    """A new temp folder marked as this process's, so a later start can tell it was left by a crash."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    (folder / OWNER_MARKER).write_text(f"{os.getpid()} {_process_start(os.getpid())}")
    return folder


def _owner_alive(folder: Path) -> bool:
    try:
        pid_text, _, start = (folder / OWNER_MARKER).read_text().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return True  # no readable marker: not provably ours, leave it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _process_start(pid) == start.strip() or not start.strip()


def sweep_dead_folders(parents: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Remove the folders an earlier app process left (crashed, killed): ours by prefix and marker,
    and that process no longer runs. Nothing else is touched."""
    removed = []
    for parent in parents:
        base = Path(parent)
        for child in list(base.iterdir()) if base.is_dir() else []:
            if not child.name.startswith((LIVE_PREFIX, GRADIO_PREFIX)) or not child.is_dir() or child.is_symlink():
                continue
            if (child / OWNER_MARKER).is_file() and not _owner_alive(child):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child.name)
    return removed


def own_gradio_temp(environ: dict[str, str] | None = None) -> Path:
    """Point Gradio's cache (uploads, downloads) at a folder of this process, inside the one it
    would use: shutdown removes it whole, and a later start removes it if this process crashed.
    Call before the app is built (Gradio reads the variable when it makes its blocks and routes)."""
    environ = os.environ if environ is None else environ
    base = Path(environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")
    base.mkdir(parents=True, exist_ok=True)
    sweep_dead_folders([base, tempfile.gettempdir()])
    folder = owned_folder(GRADIO_PREFIX, base)
    environ["GRADIO_TEMP_DIR"] = str(folder)
    return folder


class LiveFolder:
    """One folder for every live run's trace, pruned by age: nothing accumulates in /tmp."""

    def __init__(self, max_age_s: float = FILE_MAX_AGE_S) -> None:
        self.max_age_s = max_age_s
        self.path = owned_folder(LIVE_PREFIX)
        atexit.register(self.remove)  # a stopped server leaves nothing in /tmp (SIGTERM: see on_shutdown)

    def new_file(self, name: str) -> Path:
        self.prune()
        folder = Path(tempfile.mkdtemp(dir=self.path))
        return folder / name

    def prune(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        removed = 0
        for child in list(self.path.iterdir()) if self.path.exists() else []:
            try:
                if child.name != OWNER_MARKER and now - child.stat().st_mtime > self.max_age_s:
                    shutil.rmtree(child, ignore_errors=True)
                    removed += 1
            except OSError:
                continue
        return removed

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def remove_app_files(folders: Sequence[str | os.PathLike[str]], demo: Any = None) -> None:
    """The app's temp folders, and every file Gradio cached for it (uploads, downloads)."""
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    for files in getattr(demo, "temp_file_sets", []) or []:
        for name in list(files):
            path = Path(name)
            try:
                path.unlink(missing_ok=True)
                path.parent.rmdir()  # Gradio gives each cached file a folder of its own
            except OSError:
                continue


def on_shutdown(folders: Sequence[str | os.PathLike[str]], demo: Any = None) -> None:
    """On SIGTERM (how a Space is stopped at every restart) and SIGINT, remove the app's files, then
    exit: atexit handlers do not run on a signal's default action."""
    import signal

    def stop(signum: int, _frame: Any) -> None:
        remove_app_files(folders, demo)
        os._exit(128 + signum if signum == signal.SIGINT else 0)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)


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


# ----------------------------------------------------------------------------- fair lanes (issue 23)

REPLACED_MESSAGE = "replaced by your newer request of the same kind"
MAX_RUNNING_PER_SESSION = 2  # of the shared workers: other visitors always find one free


class FairLanes:
    """Every lane fair across visitors: per visitor and event kind at most one job waits (a newer one
    replaces it) and one runs; a visitor runs at most `per_session` jobs at once, and among those
    waiting the visitor served least recently goes first. One visitor's flood then delays another's
    answer by at most one job."""

    def __init__(self, per_session: int = MAX_RUNNING_PER_SESSION) -> None:
        self.per_session = per_session
        self.served: dict[str, int] = {}
        self.clock = 0
        self.replaced = 0

    def pick(self, waiting: list[Any], running: list[Any]) -> Any | None:
        """The next event to run from one lane's `waiting` list, given every running event."""
        busy: dict[str, int] = {}
        kinds: set[tuple[str, int]] = set()
        for event in running:
            busy[event.session_hash] = busy.get(event.session_hash, 0) + 1
            kinds.add((event.session_hash, id(event.fn)))
        best, best_key = None, None
        for position, event in enumerate(waiting):
            session = event.session_hash
            if busy.get(session, 0) >= self.per_session or (session, id(event.fn)) in kinds:
                continue
            key = (busy.get(session, 0), self.served.get(session, -1), position)
            if best_key is None or key < best_key:
                best, best_key = event, key
        if best is not None:
            self.clock += 1
            self.served[best.session_hash] = self.clock
            if len(self.served) > 10_000:  # forget the oldest visitors
                for session in sorted(self.served, key=self.served.get)[:5_000]:
                    del self.served[session]
        return best


def install_fair_lanes(demo: Any, lanes: FairLanes | None = None) -> bool:
    """Wrap the queue's `push` (a newer event replaces the same visitor's queued one of its kind) and
    `get_events` (the fair pick). Gradio 6.x internals, as `install_gate`; False if they are absent."""
    queue = getattr(demo, "_queue", None)
    if queue is None or not hasattr(queue, "push") or not hasattr(queue, "get_events"):
        return False
    lanes = lanes or FairLanes()
    original_push = queue.push

    async def push(body: Any, request: Any, username: str | None) -> Any:
        accepted = await original_push(body, request, username)
        if accepted and accepted[0]:
            await _drop_replaced(queue, body.event_id, lanes)
        return accepted

    def get_events() -> Any:
        running = [event for job in queue.active_jobs if job for event in job]
        lanes_ids = list(queue.event_queue_per_concurrency_id)
        for concurrency_id in lanes_ids:
            lane = queue.event_queue_per_concurrency_id[concurrency_id]
            if not lane.queue or (
                lane.concurrency_limit is not None and lane.current_concurrency >= lane.concurrency_limit
            ):
                continue
            event = lanes.pick(lane.queue, running)
            if event is None:
                continue
            lane.queue.remove(event)
            return [event], False, concurrency_id
        return None

    queue.push = push
    queue.get_events = get_events
    return True


async def _drop_replaced(queue: Any, event_id: str | None, lanes: FairLanes) -> None:
    from gradio.server_messages import ProcessCompletedMessage

    new = queue.event_ids_to_events.get(event_id)
    if new is None:
        return
    async with queue.delete_lock:
        lane = queue.event_queue_per_concurrency_id.get(new.concurrency_id)
        old = [e for e in (lane.queue if lane else []) if e is not new and e.session_hash == new.session_hash]
        old = [e for e in old if e.fn is new.fn]
        for event in old:
            lane.queue.remove(event)
            queue.event_ids_to_events.pop(event._id, None)
            pending = queue.pending_event_ids_session.get(event.session_hash)
            if pending is not None:
                pending.discard(event._id)
            message = {"error": REPLACED_MESSAGE, "duration": 5, "visible": True, "title": "Replaced"}
            queue.send_message(event, ProcessCompletedMessage(output=message, success=False, title="Replaced"))
            lanes.replaced += 1


# ----------------------------------------------------------------------------- the memory ceiling (issue 23)

UNLOADED_MESSAGE = "this run was unloaded to free memory; load it again"
PUBLIC_RUN_MEMORY_MB = 4096  # loaded runs of every session together, public mode


def run_memory_ceiling(public: bool, environ: dict[str, str] | None = None) -> int | None:
    """Bytes of loaded runs the app keeps (public mode: 4 GB, or SPECVIZ_RUN_MEMORY_MB); None: no ceiling."""
    environ = os.environ if environ is None else environ
    value = environ.get("SPECVIZ_RUN_MEMORY_MB")
    if value:
        return int(float(value) * 2**20)
    return PUBLIC_RUN_MEMORY_MB * 2**20 if public else None


def estimate_run_bytes(loaded: Any) -> int:
    """What a loaded run keeps, from what it holds (calibrated by tools/attack_suite.py: rows with
    their analysis ~3 KB, a list item ~40 B, a piece-table entry twice over ~300 B, text 1 B a char)."""
    trace = loaded.trace
    rows = cells = 0
    for step in trace.steps:
        rows += len(step.rows)
        for row in step.rows:
            cells += len(row.draft_tokens) + len(row.target_tokens) + len(row.emitted) + len(row.position_ids)
    chars = 0
    for seq in trace.sequences:
        cells += len(seq.prompt_ids) + len(seq.output_ids) + len(seq.reference_ids or ())
        chars += len(seq.prompt or "") + len(seq.output_text or "")
    pieces = len(getattr(loaded, "texts", None) or ()) + len(trace.header.token_text or ())
    return 256 * 1024 + 3_000 * rows + 40 * cells + 150 * pieces + chars


class RunMemory:
    """Every loaded run of every session, with its estimated size; past the ceiling the least
    recently used runs of idle sessions are unloaded in place (their handlers then see an empty
    slot and a note, see `install_memory`). Runs shared by all sessions (bundled) are not counted."""

    def __init__(self, ceiling: int | None, estimate: Callable[[Any], int] = estimate_run_bytes) -> None:
        import weakref

        self.ceiling = ceiling
        self.estimate = estimate
        self._weakref = weakref
        self._runs: dict[int, dict[str, Any]] = {}  # id(run) -> {ref, session, size, used}
        self._sessions: dict[str, float] = {}  # session -> last request
        self._active: dict[str, int] = {}  # session -> handlers running now
        self._lock = threading.RLock()
        self.evicted = 0

    def total(self) -> int:
        with self._lock:
            return sum(entry["size"] for entry in self._runs.values())

    def begin(self, session: str | None) -> None:
        if session is None:
            return
        with self._lock:
            self._sessions[session] = time.monotonic()
            self._active[session] = self._active.get(session, 0) + 1

    def end(self, session: str | None) -> None:
        if session is None:
            return
        with self._lock:
            left = self._active.get(session, 1) - 1
            if left > 0:
                self._active[session] = left
            else:
                self._active.pop(session, None)
            self._sessions[session] = time.monotonic()

    def use(self, run: Any) -> None:
        with self._lock:
            entry = self._runs.get(id(run))
            if entry is not None:
                entry["used"] = time.monotonic()

    def track(self, run: Any, session: str | None) -> None:
        """A run landed in `session`'s state: count it, then make room by unloading others."""
        if self.ceiling is None or run is None or getattr(run, "shared", False) or getattr(run, "evicted", False):
            return
        key = id(run)
        with self._lock:
            if key in self._runs:
                self._runs[key]["used"] = time.monotonic()
                return
        size = self.estimate(run)

        def forget(_ref: Any, key: int = key) -> None:
            with self._lock:
                self._runs.pop(key, None)

        with self._lock:
            self._runs[key] = {
                "ref": self._weakref.ref(run, forget),
                "session": session or "",
                "size": size,
                "used": time.monotonic(),
            }
        self.make_room(keep=session)

    def make_room(self, keep: str | None = None) -> int:
        """Unload least recently used runs of idle sessions (never `keep`'s) until under the ceiling."""
        if self.ceiling is None:
            return 0
        victims = []
        with self._lock:
            total = sum(entry["size"] for entry in self._runs.values())
            if total <= self.ceiling:
                return 0
            idle = [
                (self._sessions.get(entry["session"], 0.0), entry["used"], key)
                for key, entry in self._runs.items()
                if entry["session"] != keep and not self._active.get(entry["session"])
            ]
            for _, _, key in sorted(idle):
                if total <= self.ceiling:
                    break
                entry = self._runs.pop(key)
                total -= entry["size"]
                run = entry["ref"]()
                if run is not None:
                    victims.append(run)
        for run in victims:
            unload_run(run)
        self.evicted += len(victims)
        if victims:
            release_memory()
        return len(victims)


def unload_run(run: Any) -> None:
    """Empty a loaded run in place: the session's state keeps a husk that says it was unloaded."""
    for name in ("trace", "report", "history"):
        if hasattr(run, name):
            object.__setattr__(run, name, None)
    object.__setattr__(run, "texts", {})
    object.__setattr__(run, "figures", {})
    object.__setattr__(run, "evicted", True)


def _request_session() -> str | None:
    try:
        from gradio.context import LocalContext

        request = LocalContext.request.get(None)
    except (ImportError, LookupError):
        return None
    return getattr(request, "session_hash", None)


def install_memory(demo: Any, memory: RunMemory, run_type: type) -> int:
    """Wrap every handler of `demo`: a run that was unloaded reaches it as an empty slot (with a
    warning toast, never an error badge), and every run it puts in a state is counted by `memory`."""
    import functools
    import inspect

    wrapped = 0
    for block_fn in getattr(demo, "fns", {}).values():
        fn = getattr(block_fn, "fn", None)
        if fn is None or inspect.iscoroutinefunction(fn) or inspect.isgeneratorfunction(fn):
            continue

        def wrapper(*args: Any, __fn: Any = fn, **kwargs: Any) -> Any:
            session = _request_session()
            memory.begin(session)
            try:
                unloaded = False
                fixed = []
                for arg in args:
                    if isinstance(arg, run_type):
                        if getattr(arg, "evicted", False):
                            unloaded, arg = True, None
                        else:
                            memory.use(arg)
                    fixed.append(arg)
                if unloaded:
                    import gradio as gr

                    gr.Warning(UNLOADED_MESSAGE)
                result = __fn(*fixed, **kwargs)
                values = result.values() if isinstance(result, dict) else result
                for value in values if isinstance(values, (list, tuple, type({}.values()))) else [values]:
                    if isinstance(value, run_type):
                        memory.track(value, session)
                return result
            finally:
                memory.end(session)

        functools.update_wrapper(wrapper, fn)
        block_fn.fn = wrapper
        wrapped += 1
    return wrapped


_PATH = __import__("re").compile(r"(?:[A-Za-z]:)?[\\/](?:[^\s'\"\\/:]+[\\/])+([^\s'\"\\/:]*)")


def without_paths(message: str) -> str:
    """A message for the page: every file path cut to its last part (the server's folders stay private)."""
    return _PATH.sub(lambda m: m.group(1) or "…", message)
