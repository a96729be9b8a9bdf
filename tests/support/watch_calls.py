"""Target calls written by hand for the watch's rule tests, and what a reading emitted per sequence.

`target_call` is a padded batch's forward as the hooks capture it: a cache of `width` slots, each
row's 2-D mask over [cache | query] and the position of its first query token given, positions
fed, the target's argmax kept for the last query slots."""

from __future__ import annotations

from typing import Any

from specviz.watch.hooks import Declared, ModelHooks
from specviz.watch.record import CallRecord


def target_call(ids: list[list[int]], width: int, masks: list[list[int]], positions: list[int], argmax) -> CallRecord:
    """A target call with a cache of `width` slots; each row's 2-D mask and first position given."""
    q = len(ids[0])
    return CallRecord(
        role="target", rows=None, input_ids=ids, positions=[list(range(p, p + q)) for p in positions],
        positions_fed=True, cache_width=width, mask_kind="2d", mask=masks, batch_size=len(ids),
        query_len=q, argmax=argmax,
    )  # fmt: skip


def tokens_of(emits: list[Any]) -> dict[int, list[int]]:
    """Sequence -> the tokens its emits carry, in order."""
    out: dict[int, list[int]] = {}
    for e in emits:
        out.setdefault(e.seq_id, []).extend(e.tokens)
    return out


class CallList:
    """A `hooks.CallSink` that keeps the calls and declares nothing."""

    def __init__(self) -> None:
        self.calls: list[CallRecord] = []

    def declared(self, role: str = "target") -> Declared:
        return Declared()

    def add_call(self, call: CallRecord) -> None:
        self.calls.append(call)


def recorded(model: Any, *args: Any, drafter: bool = False, **kwargs: Any) -> tuple[list[CallRecord], Any]:
    """The calls `ModelHooks` recorded of one forward of `model`, and its output."""
    sink = CallList()
    hooks = ModelHooks(model, "draft" if drafter else "target", sink, drafter=drafter)
    try:
        out = model(*args, **kwargs)
    finally:
        hooks.remove()
    return sink.calls, out
