"""transformers' continuous batching (`generate_batch`, `ContinuousBatchingManager`) read from its manager.

Its model forward is packed (`PagedAttentionArgs`: input_ids [1, T], position_ids, cu_seq_lens_q/k,
read/write indices into a paged cache, logits_indices), so `batchmap` cuts every call into its
requests by `cu_seq_lens_q`; which request sits in each place, and what each received, only the
manager knows. While a watch is open this module wraps two of its methods (restored at close):
- `ContinuousBatchingIOs.prepare_batch_tensors`: the requests of the next forward, in order,
  become that forward's declared rows (a request is a sequence: the declared prompt equal to its
  prompt tokens, else a new sequence in order of appearance);
- `ContinuousBatchProcessor.update_batch`: the tokens each request gained are reported as its
  emission, with "eos" or "length" when the manager finished it (its own `max_new_tokens`: a
  budget per sequence).
The manager's report is the reading. An engine that also calls `w.emit` for a sequence the manager
named (it reports each step, or the outputs at the end) is not counted twice: its emits are kept
apart and compared with the report at close (`reconcile`). Where they disagree (another token, a
token more or less, another ending), the run is unreadable from the step of the first difference,
with both versions in the reason: which of the two the sequence got is not known.
Synchronous batching only, CUDA graphs off (a replayed graph runs no hooks; the async manager
feeds placeholder ids that it fills on the device). Nothing here imports transformers until a
watch opens with it installed.
"""

from __future__ import annotations

from typing import Any, Protocol


class PagedSink(Protocol):
    """What the capture tells the watch (`Watch` or `AutoWatch`)."""

    def declare_forward(self, seq_ids: tuple[int, ...]) -> None: ...

    def report(self, seq_id: int, token_ids: list[int], finish_reason: str | None = None) -> None:
        """The tokens the manager gave a sequence in the forward just run (its ending, if it ended)."""
        ...


class PagedCapture:
    """Requests to sequences, per forward and per update; `install` / `uninstall` wrap the manager."""

    def __init__(self, sink: PagedSink, prompts: list[list[int]] | None) -> None:
        self.sink = sink
        self.declared = prompts  # the watch's prompts, if it has any
        self.prompts: list[list[int]] = []  # by sequence id, as the requests arrived (no declared prompts)
        self.seq_of: dict[str, int] = {}  # request id -> sequence id
        # The sequences named so far: a set, as the engine's `emit` may ask from another thread
        # than the manager's, which adds to it (a lookup never iterates while it grows).
        self.named: set[int] = set()
        self.batch: list[Any] = []  # the request states of the forward in flight
        self.seen: dict[str, int] = {}  # request id -> tokens already emitted
        self.eos_ids: set[int] = set()  # every request's own EOS ids (a generation config's)
        # The engine's own `emit`s for sequences the manager named: compared with its report, never added.
        self.engine: dict[int, list[tuple[list[int], str | None]]] = {}
        self._saved: list[tuple[Any, str, Any]] = []

    # ------------------------------------------------------------------ installing

    def install(self) -> bool:
        """Wrap the manager's methods; False when this transformers has no continuous batching."""
        try:
            from transformers.generation.continuous_batching import continuous_api, input_outputs
        except ImportError:
            return False
        capture = self
        io_class, processor = input_outputs.ContinuousBatchingIOs, continuous_api.ContinuousBatchProcessor
        prepare, update = io_class.prepare_batch_tensors, processor.update_batch

        def prepare_batch_tensors(io: Any, requests_in_batch: list[Any], *args: Any, **kwargs: Any) -> Any:
            result = prepare(io, requests_in_batch, *args, **kwargs)
            capture.forward([f.state for f in requests_in_batch])
            return result

        def update_batch(proc: Any, *args: Any, **kwargs: Any) -> Any:
            result = update(proc, *args, **kwargs)
            capture.updated()
            return result

        self._saved = [(io_class, "prepare_batch_tensors", prepare), (processor, "update_batch", update)]
        io_class.prepare_batch_tensors = prepare_batch_tensors
        processor.update_batch = update_batch
        return True

    def uninstall(self) -> None:
        for owner, name, original in self._saved:
            setattr(owner, name, original)
        self._saved = []

    # ------------------------------------------------------------------ what the manager says

    def forward(self, states: list[Any]) -> None:
        """The next forward holds these requests, in this order."""
        self.batch = list(states)
        self.sink.declare_forward(tuple(self._seq(s) for s in states))

    def updated(self) -> None:
        """Each request of the forward gained its new tokens (and ended, when the manager finished it)."""
        for state in self.batch:
            tokens = list(state.generated_tokens)
            new = tokens[self.seen.get(state.request_id, 0) :]
            self.seen[state.request_id] = len(tokens)
            done = getattr(getattr(state, "status", None), "name", "") == "FINISHED"
            if not new and not done:
                continue  # a prefill chunk: no token yet
            reason = None
            eos = getattr(state, "_eos_token_ids", set()) or set()
            self.eos_ids.update(int(t) for t in eos)
            if done:
                reason = "eos" if tokens and tokens[-1] in eos else "length"
            self.sink.report(self.seq_of[state.request_id], new, reason)
        self.batch = []

    def engine_emit(self, seq_id: int, tokens: list[int], finish_reason: str | None) -> bool:
        """Keep an `emit` of the engine's apart when the manager reports that sequence (True);
        False: the manager never named it, the emit is the engine's word as usual."""
        if seq_id not in self.named:
            return False
        self.engine.setdefault(seq_id, []).append((list(tokens), finish_reason))
        return True

    def reconcile(self, calls: list[Any], reported: list[Any]) -> None:
        """Compare each sequence's engine emits with the manager's report (`reported`: the watch's
        emits, `steps.Emit`); at the first difference, the target call that made the reported token
        there is marked unreadable (`steps.first_unreadable` cuts the steps before it)."""
        targets = [j for j, call in enumerate(calls) if call.role == "target"]
        for seq_id, emits in sorted(self.engine.items()):
            said = [e for e in reported if e.seq_id == seq_id]
            where = _first_difference(said, emits)
            if where is None:
                continue
            after, why = where
            # The call that made the first token the two disagree on; where the manager reported
            # none (after 0: the engine emitted for a sequence it never wrote to), the first call.
            made = [j for j in targets if j < after] or targets[:1]
            if made:
                calls[made[-1]].mark_unreadable(f"sequence {seq_id}: {why}")

    def _seq(self, state: Any) -> int:
        """The sequence a request is: the first declared prompt equal to its prompt not yet taken,
        else a new id past every declared prompt (a declared prompt's id stays its own, whenever
        its request arrives)."""
        rid = state.request_id
        if rid in self.seq_of:
            return self.seq_of[rid]
        prompt = list(getattr(state, "initial_tokens", []) or [])
        if self.declared is not None:
            seq = next((i for i, p in enumerate(self.declared) if p == prompt and i not in self.named), None)
            if seq is None:
                seq = max([len(self.declared) - 1, *self.named]) + 1
        else:
            seq = len(self.prompts)
            self.prompts.append(prompt)
        self.seq_of[rid] = seq
        self.named.add(seq)
        return seq


def _first_difference(reported: list[Any], engine: list[tuple[list[int], str | None]]) -> tuple[int, str] | None:
    """(call count after the manager's emit where the engine's emits first disagree with its
    report, why); None when the engine emitted the same tokens and, where it declared one, the
    same ending."""
    tokens = [(t, e.after) for e in reported for t in e.tokens]
    said = [t for e, _ in engine for t in e]
    ending = next((e.finish_reason for e in reversed(reported) if e.finish_reason), None)
    declared = next((reason for _, reason in reversed(engine) if reason), None)
    shared = min(len(said), len(tokens))
    i = next((i for i in range(shared) if said[i] != tokens[i][0]), shared)  # the first token that differs
    if i < shared:
        why = f"the engine emitted {said[i]} as output token {i}, the manager reported {tokens[i][0]}"
    elif len(said) != len(tokens):
        why = f"the engine emitted {len(said)} tokens, the manager reported {len(tokens)}"
    elif declared in (None, ending):
        return None
    else:
        why = f"the engine ended it by {declared!r}, the manager by {ending!r}"
    last = reported[-1].after if reported else 0
    after = tokens[i][1] if i < len(tokens) else last
    return after, f"{why} (transformers' continuous batching manager and w.emit disagree)"
