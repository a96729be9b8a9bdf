"""Fair lanes: every event kind is fair across visitors (issue 23). Per visitor and kind at most one
job waits (a newer request replaces the older one), one of a visitor's jobs runs at a time, and the
visitor served least recently goes first.
"""

from __future__ import annotations

from typing import Any

from specviz.app.serve import LIVE_CONCURRENCY_ID

# gr.skip(): an output given this keeps what it shows.
NO_CHANGE = {"__type__": "update"}
# Jobs share one GIL and 2 cores: every running job of a flooder slows everyone else's as much as
# one more job. With one at a time, another visitor's answer shares the CPU with one of them.
# A live run (its own lane of one, for everyone) is not counted: a visitor inspects while it runs.
MAX_RUNNING_PER_SESSION = 1


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
            kinds.add((event.session_hash, id(event.fn)))
            if getattr(event, "concurrency_id", None) != LIVE_CONCURRENCY_ID:  # a live run has its own
                busy[event.session_hash] = busy.get(event.session_hash, 0) + 1  # lane of one: not counted
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


def replaced_output(event: Any) -> dict[str, Any]:
    """What a replaced job answers: a success that changes none of its outputs. Not an error: the
    page marks every output of a failed job with an "Error" badge and a toast, and a visitor who
    clicked again while the server was busy did nothing wrong (seen in the browser test on a loaded
    machine). The newer job draws what they asked for; an API client gets one `NO_CHANGE` per output."""
    outputs = len(getattr(event.fn, "outputs", None) or [])
    return {"data": [dict(NO_CHANGE) for _ in range(outputs)], "is_generating": False}


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
            queue.send_message(event, ProcessCompletedMessage(output=replaced_output(event), success=True))
            lanes.replaced += 1
