"""What the app needs to be a safe public Space: public mode, a fair live-run lane, cleanup, memory.

- Public mode (env `SPACE_ID` set, or `python app.py --public`): live runs use the bundled model
  pair only (the model fields are hidden, and the server refuses any other path a client sends,
  with one message that says nothing about the path), with smaller prompt and token caps.
- The live-run lane: a visitor (browser session) has at most one live run queued or running, and
  at most `MAX_PENDING_LIVE` wait in all. Both are refused when the event is *queued*, not when it
  would run, so a flood of live runs never fills Gradio's queue: loading and inspecting traces
  keep their own lane and never see "Queue is full" because of live runs.
Files (`files.py`), the memory ceiling (`memory.py`) and the fair lanes of the other events
(`lanes.py`) are modules of their own.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

LIVE_CONCURRENCY_ID = "live-run"
MAX_PENDING_LIVE = 8  # live runs queued or running, all visitors together
PENDING_EXPIRY_S = 30 * 60  # a pending mark whose run never reported back (client vanished)
SESSION_TTL_S = 30 * 60  # a session's loaded runs are dropped this long after their last change
FILE_MAX_AGE_S = 30 * 60  # uploads Gradio kept and live-run traces are deleted after this long

# Live-run bounds: local use (one user's machine) and public use (a shared 2-core Space).
# A tree's alternatives (`tree_branches`) are also capped by k: together at most the largest k (`LiveRequest`).
LOCAL_LIMITS = {
    "batch_size": (1, 32), "draft_k": (1, 8), "max_new_tokens": (1, 256), "num_prompts": (1, 64),
    "tree_branches": (0, 4),
}  # fmt: skip
PUBLIC_LIMITS = {
    "batch_size": (1, 8), "draft_k": (1, 8), "max_new_tokens": (1, 64), "num_prompts": (1, 16),
    "tree_branches": (0, 4),
}  # fmt: skip
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
    """Who has a live run queued or running, checked when a live-run event asks to be queued.

    The run's handler releases its mark when it ends. Gradio can end a run before its handler
    starts (inputs out of a slider's range, sent by an API client): `alive` (set by `install_gate`:
    is this event still in Gradio's queue?) lets the gate see such a run gone, instead of keeping
    the visitor locked out until the mark expires."""

    def __init__(
        self,
        max_pending: int = MAX_PENDING_LIVE,
        expiry_s: float = PENDING_EXPIRY_S,
        alive: Callable[[str], bool] | None = None,
    ) -> None:
        self.max_pending = max_pending
        self.expiry_s = expiry_s
        self.alive = alive
        self._pending: dict[str, float] = {}  # session hash -> when its run was queued
        self._events: dict[str, str] = {}  # session hash -> its run's event id, once Gradio queued it
        self._lock = threading.Lock()

    def admit(self, session: str) -> str | None:
        """Mark `session` as having a live run; the reason to refuse it instead, if any."""
        now = time.monotonic()
        with self._lock:
            for key, since in list(self._pending.items()):
                if now - since > self.expiry_s or self._ended(key):
                    self._drop(key)
            if session in self._pending:
                return ONE_RUN_MESSAGE
            if len(self._pending) >= self.max_pending:
                return BUSY_MESSAGE.format(count=len(self._pending))
            self._pending[session] = now
            return None

    def queued(self, session: str, event_id: str) -> None:
        """Gradio queued `session`'s admitted run as `event_id`."""
        with self._lock:
            if session in self._pending:
                self._events[session] = event_id

    def done(self, session: str | None) -> None:
        if session is not None:
            with self._lock:
                self._drop(session)

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _ended(self, session: str) -> bool:
        """The session's run left Gradio's queue without its handler releasing it."""
        event = self._events.get(session)
        return event is not None and self.alive is not None and not self.alive(event)

    def _drop(self, session: str) -> None:
        self._pending.pop(session, None)
        self._events.pop(session, None)


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

    events = getattr(queue, "event_ids_to_events", None)  # Gradio's queued and running events
    if isinstance(events, dict):
        gate.alive = events.__contains__

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
            else:
                gate.queued(session, accepted[1])
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


_PATH = __import__("re").compile(r"(?:[A-Za-z]:)?[\\/](?:[^\s'\"\\/:]+[\\/])+([^\s'\"\\/:]*)")


def without_paths(message: str) -> str:
    """A message for the page: every file path cut to its last part (the server's folders stay private)."""
    return _PATH.sub(lambda m: m.group(1) or "…", message)
