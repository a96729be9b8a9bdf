"""The Watch: hooks on the user's models, plus the two facts hooks cannot see (rows and emits).
`specviz.watch(target, draft, ...)` makes one (docs/watch.md): `w.rows` or `w.batch` say which sequence
each row holds, `w.emit` what a sequence received, and `w.close()` infers the steps and writes the trace."""

from __future__ import annotations

import math
import os
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from specviz.analysis.budgets import BUDGETS
from specviz.analysis.findings import UNREADABLE
from specviz.collector import collector_paused
from specviz.engine.reference import greedy_reference
from specviz.trace.io import save_trace
from specviz.trace.naming import now_iso
from specviz.trace.provenance import library_versions, model_info
from specviz.trace.schema import LAYOUTS, SCHEMA_VERSION, Header, SamplingInfo, SequenceRecord, Trace
from specviz.watch import declared
from specviz.watch.attribution import Emit
from specviz.watch.calls import attended_ids
from specviz.watch.content import check_content
from specviz.watch.headinput import HiddenTap
from specviz.watch.hooks import NO_TAP, Declared, ModelHooks, WatchError, check_causal_lm
from specviz.watch.infer.follow import follow_rows
from specviz.watch.paged import PagedCapture
from specviz.watch.record import CallRecord
from specviz.watch.steps import InferredSteps, infer_steps
from specviz.watch.tree import alternatives

FINISH_REASONS = (None, "eos", "length")
# Model -> the open watch whose hooks are on it: a second watch on it would record every call too
# (and the first one the second's), so it is refused until the first closes.
_WATCHED: weakref.WeakKeyDictionary[Any, Watch] = weakref.WeakKeyDictionary()


class Recorder:
    """What the hooks and the paged capture report to (`hooks.CallSink`, `paged.PagedSink`): the
    calls, each forward's declaration, and the tokens each sequence received."""

    def __init__(self) -> None:
        self._calls: list[CallRecord] = []
        self._emits: list[Emit] = []
        self._rows: dict[str, tuple[int, ...] | None] = {"target": None, "draft": None}  # `rows`: every forward
        self._once: dict[str, Declared] = {}  # `batch`, the paged manager: the next forward of that role

    def declared(self, role: str = "target") -> Declared:
        """The forward's own declaration (taken: it was for that one forward), else the rows."""
        return self._once.pop(role, Declared(self._rows[role]))

    def declare_forward(self, seq_ids: tuple[int, ...]) -> None:
        """The paged manager's requests of the next target forward; what `batch` said besides stays."""
        self._once["target"] = self._once.get("target", Declared())._replace(rows=tuple(seq_ids))

    def add_call(self, call: CallRecord) -> None:
        self._calls.append(call)

    def report(self, seq_id: int, tokens: list[int], finish_reason: str | None = None) -> None:
        """Tokens a sequence received: the engine's `emit`, or the paged manager's report."""
        self._emits.append(Emit(seq_id, list(tokens), finish_reason, after=len(self._calls), at=time.perf_counter()))


class Watch(Recorder):
    """One watched run. Use `specviz.watch(...)` to make one; see the module docstring."""

    def __init__(
        self,
        target: Any,
        draft: Any | None = None,
        *,
        tokenizer: Any | None = None,
        prompts: list[list[int]] | list[str] | None = None,
        out: str | os.PathLike[str] | None = None,
        name: str | None = None,
        layout: str = "unspecified",
        temperature: float = 0.0,
        logits_processed: bool = False,
        drafter: Any | None = None,
    ) -> None:
        super().__init__()
        if layout not in LAYOUTS:
            raise WatchError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if not isinstance(logits_processed, bool):
            raise WatchError(f"logits_processed must be True or False, got {logits_processed!r}")
        self.temperature = declared.checked_temperature(temperature)
        # Without prompts a sequence id is any index >= 0; with them, one of theirs.
        self.prompts, self.prompt_texts, self._known = None, {}, math.inf
        self._unknown = "{what}: sequence ids are prompt indices (0, 1, ...), got {seq_id}"
        if prompts is not None:
            listed = list(prompts)  # once: a generator is read one time
            self.prompts = declared.prompt_ids(listed, tokenizer)
            self.prompt_texts = {i: p for i, p in enumerate(listed) if isinstance(p, str)}
            self._known = len(self.prompts)
            self._unknown = f"{{what}}: unknown sequence {{seq_id}}; prompts are sequences 0..{self._known - 1}"
        check_causal_lm(target, "target")
        if draft is not None:
            check_causal_lm(draft, "draft")
        if draft is target:
            raise WatchError("draft and target are the same module; pass draft=None for plain decoding")
        self._hooked = [m for m in (target, draft, drafter) if m is not None]
        for model in self._hooked:  # before any hook goes on
            if model in _WATCHED:
                raise WatchError(
                    f"{type(model).__name__} is already hooked by an open specviz.watch ({_WATCHED[model].name!r}, "
                    f"created {_WATCHED[model].created_at}): close it first (w.close(), or `with specviz.watch(...)`)"
                )
        self.target, self.draft, self.tokenizer, self.out, self.layout = target, draft, tokenizer, out, layout
        self.name, self.logits_processed, self.created_at = name or "watched", logits_processed, now_iso()
        # Greedy on the raw logits: the only case where the target's argmax is the engine's choice
        # and a batch-1 greedy decode of the target is its oracle.
        self.argmax_is_choice = self.temperature == 0 and not logits_processed
        self._ever_declared, self._closed = False, False  # rows or batch called: the engine names its rows
        self.trace: Trace | None = None  # set by close(): the context manager's result
        self._proposer = "draft-model"  # what drafted, when the run drafted
        self._hooks: list[Any] = []  # everything `close` removes (`ModelHooks`, the tap)
        tap = NO_TAP  # the target's last hidden states, to see where the head's input came from
        if drafter is not None:  # a draft head (EAGLE, MTP, Medusa): any module, fed hidden states
            if not isinstance(drafter, torch.nn.Module) or drafter in (target, draft):
                raise WatchError("drafter must be a torch module other than the target and the draft (the draft head)")
            tap = HiddenTap(target)
            self._proposer = "head"  # rows record `head_source`; a draft model, below, drafts instead
            self._hooks += [ModelHooks(drafter, "draft", self, drafter=True, tap=tap), tap]
        if draft is not None:
            self._proposer = "draft-model"
            self._hooks.append(ModelHooks(draft, "draft", self))
        self._hooks.append(ModelHooks(target, "target", self, tap=tap))
        # Always a capture: one that finds no continuous batching names no sequence and adds nothing.
        self._paged = PagedCapture(self, self.prompts)
        self._paged.install()
        _WATCHED.update((m, self) for m in self._hooked)

    def rows(self, seq_ids: Iterable[int], *, model: str | None = None) -> None:
        """Declare which sequence each batch row holds from now on, in row order; `model="draft"` (or
        "target") one side only, for a draft batch of other rows (undeclared: matched by its calls)."""
        roles = _roles(model, (None, "target", "draft"), "rows")
        self._rows.update(dict.fromkeys(roles, tuple(self._checked_ids(seq_ids, "rows"))))
        self._ever_declared = True

    def batch(
        self,
        seq_ids: Iterable[int],
        *,
        query_lens: Iterable[int] | None = None,
        model: str = "target",
        parents: Iterable[Iterable[int]] | None = None,
        drafts: Iterable[int | None] | None = None,
        chunk: Iterable[bool] | None = None,
    ) -> None:
        """Declare the next forward of `model` only: the sequence of each row or, with `query_lens`,
        of each packed segment in order; each one's tree, draft count and whether it is a prefill
        chunk (docs/watch.md)."""
        _roles(model, ("target", "draft"), "batch")
        ids = self._checked_ids(seq_ids, "batch")
        trees = None if parents is None else declared.checked_trees(parents, len(ids), model)
        lens = None
        if query_lens is not None:
            lens = [declared.as_int(n, "batch") for n in query_lens]
            if len(lens) != len(ids) or any(n <= 0 for n in lens):
                raise WatchError(f"batch: {len(ids)} sequences need {len(ids)} query lengths > 0, got {lens}")
        self._once[model] = Declared(tuple(ids), lens, trees, declared.checked_segments(drafts, chunk, lens, len(ids)))
        self._ever_declared = True

    def _checked_ids(self, seq_ids: Iterable[int], what: str) -> list[int]:
        self._require_open(what)
        ids = [declared.as_int(s, what) for s in seq_ids]
        seen: set[int] = set()
        for seq_id in ids:
            if seq_id in seen:
                raise WatchError(f"{what}: sequence {seq_id} appears twice; each row holds a different sequence")
            if not 0 <= seq_id < self._known:
                raise WatchError(self._unknown.format(what=what, seq_id=seq_id))
            seen.add(seq_id)
        return ids

    def emit(self, seq_id: int, token_ids: Iterable[int] | torch.Tensor, finish_reason: str | None = None) -> None:
        """Declare the tokens the engine appended to `seq_id` this step ("eos"/"length" when it ends)."""
        [seq_id] = self._checked_ids([seq_id], "emit")
        if finish_reason not in FINISH_REASONS:
            raise WatchError(f"emit: finish_reason must be None, 'eos' or 'length', got {finish_reason!r}")
        if isinstance(token_ids, torch.Tensor):
            token_ids = token_ids.reshape(-1).tolist()
        tokens = [declared.as_int(t, "emit") for t in token_ids]
        if not self._paged.engine_emit(seq_id, tokens, finish_reason):  # else compared with its report
            self.report(seq_id, tokens, finish_reason)

    def streamer(self) -> GenerateStreamer:
        """For HF `generate(..., streamer=w.streamer())`: its tokens become `emit` calls."""
        self._require_open("streamer")
        if self.prompts is None:
            raise WatchError("streamer: pass prompts= to watch, so rows map to sequences")
        return GenerateStreamer(self, frozenset(declared.eos_ids(self.target, self.tokenizer)), len(self.prompts))

    def close(self, reference: bool = True, *, complete: bool = True) -> Trace:
        """Remove the hooks, infer the steps, decode the references, write `out`; returns the trace."""
        self._require_open("close")
        self._closed = True
        for hooks in self._hooks:
            hooks.remove()
        for model in self._hooked:
            del _WATCHED[model]
        self._paged.uninstall()
        # Kept neither the hooks (nor the tap's states) nor the calls: the hooks point back at the watch,
        # a cycle only a full garbage collection (slow once torch is loaded) frees.
        self._hooks, calls, self._calls = [], self._calls, []
        if complete:
            declared.require_emits(calls, self._emits)
        # The manager's requests may stop on EOS ids of their own.
        eos = frozenset(declared.eos_ids(self.target, self.tokenizer)) | self._paged.eos_ids
        with collector_paused():
            for call in calls:
                call.materialize()
            targets = [c for c in calls if c.role == "target"]
            first = targets[:1]  # undeclared prompts: the paged manager's requests, else this call's rows
            prompts = (
                self.prompts or self._paged.prompts or [attended_ids(c, r) for c in first for r in range(c.batch_size)]
            )
            declared.require_prompted(prompts, self._emits)
            # Nothing ever named a row, yet a later target call holds another number of sequences
            # than there are prompts: row r cannot hold sequence r there, so the rows are followed.
            named = self._ever_declared or any(c.rows is not None for c in targets)
            if not named and any(c.batch_size != len(prompts) for c in targets[1:]):
                follow_rows(calls, prompts, eos, self._emits)
            self._paged.reconcile(calls, self._emits)  # the engine's emits for the manager's sequences
            steps = infer_steps(calls, self._emits, prompts, eos, argmax_is_choice=self.argmax_is_choice)
            if note := check_content(self.target, steps.content):  # then frees the copied keys
                steps.notes.append(note)
            steps.content.clear()
            header = self._header(steps, eos, complete and steps.unreadable is None)
        del calls, targets  # read: the reference decode below does not need them
        # A sampled or processed run is not token-exact against the raw greedy oracle: none decoded.
        references: list[tuple[Any, Any]] = [(None, None)] * len(prompts)
        if reference and self.argmax_is_choice:
            references = self._references(prompts, steps, eos)
        with collector_paused():
            trace = Trace(header=header, steps=steps.steps, sequences=self._sequences(prompts, steps, references))
            if self.tokenizer is not None:  # the piece table: readers of the trace show text, not IDs
                from specviz.trace.token_text import attach_token_text

                attach_token_text(trace, self.tokenizer)
            if self.out is not None:
                save_trace(trace, Path(self.out))
        self.trace = trace
        return trace

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """A crash in the engine still leaves a valid trace, marked incomplete (no reference decode)."""
        if not self._closed:
            self.close(reference=kind is None, complete=kind is None)

    def _require_open(self, what: str) -> None:
        if self._closed:
            raise WatchError(f"{what}: this watch is already closed")

    def _header(self, steps: InferredSteps, eos: frozenset[int], complete: bool) -> Header:
        # A call, so an event: last_event_at is set too.
        seconds = None if steps.first_call_at is None else round(steps.last_event_at - steps.first_call_at, 6)
        method, draft, proposer = (
            ("speculative", self.draft, self._proposer) if steps.k else ("baseline", None, "draft-model")
        )
        options = {  # only what was said or found is written
            "watch_notes": steps.notes[:20],
            UNREADABLE: None if steps.unreadable is None else dict(zip(("step", "why"), steps.unreadable)),
            # A budget per sequence: the check judges each "length" ending against its own.
            BUDGETS: {str(s): n for s, n in steps.budgets.items() if n != steps.max_new_tokens},
            "logits_processed": self.logits_processed,
        }
        return Header(
            schema_version=SCHEMA_VERSION,
            method=method,
            fault=None,
            target=model_info(self.target),
            draft=None if draft is None else model_info(draft),
            proposer=proposer,
            draft_k=steps.k,
            tree_branches=alternatives(steps.steps),
            batch_size=max([1, *(len(s.rows) for s in steps.steps)]),
            max_new_tokens=steps.max_new_tokens,
            eos_token_ids=sorted(eos),
            pad_token_id=declared.pad_id(self.target, self.tokenizer),
            seed=0,
            created_at=self.created_at,
            library_versions=library_versions(),
            engine=self.name,
            options={key: value for key, value in options.items() if value},
            complete=complete,
            finished_at=now_iso(),
            decode_seconds=seconds,
            layout=self.layout,
            # Speculative rejection sampling keeps the accounting but asks no equality with an oracle.
            sampling=SamplingInfo(mode="rejection", temperature=self.temperature) if self.temperature > 0 else None,
        )

    def _references(self, prompts: list[list[int]], steps: InferredSteps, eos: frozenset[int]) -> list[Any]:
        """Each prompt's batch-1 greedy (ids, margins), to its own budget (`steps.budgets`)."""
        was_training = self.target.training
        self.target.eval()
        try:
            budget = steps.budgets.get
            return [
                greedy_reference(self.target, p, budget(s, steps.max_new_tokens), eos) for s, p in enumerate(prompts)
            ]
        finally:
            self.target.train(was_training)

    def _sequences(self, prompts: list[list[int]], steps: InferredSteps, references: list[Any]) -> list[SequenceRecord]:
        return [
            SequenceRecord(
                seq_id=seq_id,
                prompt=self.prompt_texts.get(seq_id, self._decode(ids)),
                prompt_ids=list(ids),
                output_ids=list(steps.outputs.get(seq_id, [])),
                output_text=self._decode(steps.outputs.get(seq_id, [])),
                reference_ids=ref_ids,
                reference_margins=margins,
                finish_reason=steps.finish_reasons.get(seq_id),
            )
            for seq_id, (ids, (ref_ids, margins)) in enumerate(zip(prompts, references))
        ]

    def _decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def watch(
    target: Any,
    draft: Any | None = None,
    *,
    tokenizer: Any | None = None,
    prompts: list[list[int]] | list[str] | None = None,
    out: str | os.PathLike[str] | None = None,
    name: str | None = None,
    layout: str = "unspecified",
    temperature: float = 0.0,
    logits_processed: bool = False,
    drafter: Any | None = None,
) -> Watch:
    """What `specviz.watch` calls, with the same arguments (its docstring and docs/watch.md)."""
    return Watch(**locals())


_ROLES = {None: ("target", "draft"), "target": ("target",), "draft": ("draft",)}  # the rows `model=` declares


def _roles(model: str | None, allowed: tuple[str | None, ...], what: str) -> tuple[str, ...]:
    if model not in allowed:
        names = ", ".join(map(repr, allowed[:-1]))
        raise WatchError(f"{what}: model must be {names} or {allowed[-1]!r}, got {model!r}")
    return _ROLES[model]


class GenerateStreamer:
    """HF `generate(..., streamer=w.streamer())` (greedy, no assistant model): the prompt batch first,
    then one token per row (the prompts in order) per step, each an `emit`; a finished row's padding
    is not emitted, and what is unfinished at the end ran out of budget."""

    def __init__(self, watch: Watch, eos_ids: frozenset[int], batch_size: int) -> None:
        self.watch, self.eos, self.batch_size = watch, eos_ids, batch_size
        self.saw_prompt = False
        self.finished: set[int] = set()

    def put(self, value: Any) -> None:
        if not self.saw_prompt:  # the first call carries the prompts
            self.saw_prompt = True
            return
        tokens = value.reshape(self.batch_size, -1).tolist()
        for seq_id in sorted(set(range(self.batch_size)) - self.finished):
            row = tokens[seq_id]
            ended = next((i + 1 for i, t in enumerate(row) if t in self.eos), None)
            if ended is None:
                self.watch.emit(seq_id, row, None)
            else:  # up to its EOS; the row is padding from then on
                self.watch.emit(seq_id, row[:ended], "eos")
                self.finished.add(seq_id)

    def end(self) -> None:
        for seq_id in sorted(set(range(self.batch_size)) - self.finished):
            self.watch.emit(seq_id, [], "length")
        self.finished.update(range(self.batch_size))
