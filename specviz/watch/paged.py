"""transformers' continuous batching (`generate_batch`, `ContinuousBatchingManager`), read from its
manager: while a watch is open two of its methods are wrapped (`install`). Its report of which request
each forward holds and what each received is the reading; an engine's own `w.emit` is compared with it."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any, Protocol

from specviz.watch.view import slots_on


class PagedSink(Protocol):
    """What the capture tells the watch: each forward's sequences, and each sequence's new tokens."""

    def declare_forward(self, seq_ids: tuple[int, ...]) -> None: ...
    def report(self, seq_id: int, token_ids: list[int], finish_reason: str | None = None) -> None: ...


class Patches(list[tuple[type, str, Any]]):
    """Methods replaced on classes, each (owner, name, original); `restore` puts them back (twice is harmless)."""

    def replace(self, owner: type, name: str, replacement: Any) -> None:
        self.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def after(self, owner: type, name: str, then: Callable[..., Any]) -> None:
        """`owner.name` calls `then` with its own arguments once it has run; its result is unchanged."""
        original = getattr(owner, name)

        def patched(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            then(*args, **kwargs)
            return result

        self.replace(owner, name, patched)

    def restore(self) -> None:
        for owner, name, original in reversed(self):
            setattr(owner, name, original)
        self.clear()


class PagedCapture:
    """Requests to sequences, per forward and per update; `install` / `uninstall` wrap the manager."""

    def __init__(self, sink: PagedSink, prompts: list[list[int]] | None) -> None:
        self.sink = sink
        self.declared = prompts  # the watch's prompts, if it has any
        self.prompts: list[list[int]] = []  # by sequence id, as the requests arrived (no declared prompts)
        self.seq_of: dict[str, int] = {}  # request id -> sequence id
        # A set: the engine's `emit` may look up from another thread while the manager adds to it.
        self.named: set[int] = set()
        self.batch: list[Any] = []  # the request states of the forward in flight
        self.seen: dict[str, int] = {}  # request id -> tokens already emitted
        self.eos_ids: set[int] = set()  # every request's own EOS ids (a generation config's)
        # The engine's own `emit`s for sequences the manager named: compared with its report, never added.
        self.engine: dict[int, list[tuple[list[int], str | None]]] = {}
        self._saved = Patches()

    def install(self) -> bool:
        """Wrap the manager's methods; False when this transformers has no continuous batching."""
        try:
            from transformers.generation.continuous_batching import continuous_api, input_outputs
        except ImportError:
            return False
        io_class, processor = input_outputs.ContinuousBatchingIOs, continuous_api.ContinuousBatchProcessor
        self._saved.after(
            io_class,
            "prepare_batch_tensors",
            lambda io, requests_in_batch, *_, **__: self.forward([f.state for f in requests_in_batch]),
        )
        self._saved.after(processor, "update_batch", lambda *_, **__: self.updated())
        return True

    def uninstall(self) -> None:
        self._saved.restore()

    def forward(self, states: list[Any]) -> None:
        """`prepare_batch_tensors`: the next forward holds these requests, in order (its declared rows)."""
        self.batch = list(states)
        self.sink.declare_forward(tuple(self._seq(s) for s in states))

    def updated(self) -> None:
        """`update_batch`: each request's new tokens, with "eos" or "length" where the manager finished it."""
        for state in self.batch:
            tokens = list(state.generated_tokens)
            new = tokens[self.seen.get(state.request_id, 0) :]
            self.seen[state.request_id] = len(tokens)
            done = getattr(getattr(state, "status", None), "name", "") == "FINISHED"
            if not new and not done:
                continue  # a prefill chunk: no token yet
            eos = {int(t) for t in getattr(state, "_eos_token_ids", ())}  # a set, by its dataclass field
            self.eos_ids |= eos
            ending = "eos" if eos.intersection(tokens[-1:]) else "length"
            self.sink.report(self.seq_of[state.request_id], new, ending if done else None)
        self.batch = []

    def engine_emit(self, seq_id: int, tokens: list[int], finish_reason: str | None) -> bool:
        """Keep an `emit` of the engine's apart (True) when the manager names that sequence."""
        if seq_id not in self.named:
            return False
        self.engine.setdefault(seq_id, []).append((list(tokens), finish_reason))
        return True

    def reconcile(self, calls: list[Any], reported: list[Any]) -> None:
        """Mark unreadable the target call that made the first token where a sequence's engine emits
        and the manager's (`reported`) disagree, both versions in the reason."""
        targets = [j for j, call in enumerate(calls) if call.role == "target"]
        by_seq: dict[int, list[Any]] = {}
        for e in reported:
            by_seq.setdefault(e.seq_id, []).append(e)
        for seq_id, emits in sorted(self.engine.items()):
            where = _first_difference(by_seq.get(seq_id, []), emits)
            if where is None or not targets:
                continue
            after, why = where
            # The last target call before `after` (the first where the manager reported nothing).
            made = targets[max(bisect_left(targets, after) - 1, 0)]
            calls[made].mark_unreadable(f"sequence {seq_id}: {why}")

    def _seq(self, state: Any) -> int:
        """The request's sequence: the first untaken declared prompt equal to its prompt, else a new
        id past every declared one (without declared prompts, in order of appearance)."""
        rid = state.request_id
        if rid in self.seq_of:
            return self.seq_of[rid]
        prompt = list(getattr(state, "initial_tokens", []))  # a list, by its dataclass field
        if self.declared is not None:
            new = max([len(self.declared) - 1, *self.named]) + 1
            seq = min({i for i, p in enumerate(self.declared) if p == prompt} - self.named, default=new)
        else:
            seq = len(self.prompts)
            self.prompts.append(prompt)
        self.seq_of[rid] = seq
        self.named.add(seq)
        return seq


def _first_difference(reported: list[Any], engine: list[tuple[list[int], str | None]]) -> tuple[int, str] | None:
    """(the `after` of the manager's emit where the engine's first disagree, why); None: they agree."""
    tokens = [t for e in reported for t in e.tokens]
    # The emit that made each reported token, then (past them) the last emit.
    afters = [e.after for e in reported for _ in e.tokens] + [max([0, *(e.after for e in reported)])]
    said = [t for e, _ in engine for t in e]
    ending, declared = _ending([e.finish_reason for e in reported]), _ending([reason for _, reason in engine])
    shared = min(len(said), len(tokens))
    i = min(slots_on([a != b for a, b in zip(said, tokens)]), default=shared)  # the first token that differs
    if i < shared:
        why = f"the engine emitted {said[i]} as output token {i}, the manager reported {tokens[i]}"
    elif len(said) != len(tokens):
        why = f"the engine emitted {len(said)} tokens, the manager reported {len(tokens)}"
    elif declared in (None, ending):
        return None
    else:
        why = f"the engine ended it by {declared!r}, the manager by {ending!r}"
    return afters[i], f"{why} (transformers' continuous batching manager and w.emit disagree)"


def _ending(reasons: list[str | None]) -> str | None:
    """The last finish reason given (None: none was)."""
    return next((reason for reason in reversed(reasons) if reason), None)
