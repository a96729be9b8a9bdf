"""The Watch: hooks on the user's models, plus the two facts hooks cannot see (rows and emits).

    w = specviz.watch(target, draft, tokenizer=tok, prompts=prompts, out="run.trace.json")
    w.rows(seq_ids)                 # which sequence each batch row holds, when that changes
    w.emit(seq_id, tokens, reason)  # what the engine appended to a sequence this step
    trace = w.close()               # steps inferred from the calls; trace written to `out`

Declared: rows and emits (and, optionally, the layout). Captured: everything the models were fed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from specviz.collector import collector_paused
from specviz.trace.io import save_trace
from specviz.trace.naming import now_iso
from specviz.trace.schema import LAYOUTS, Trace
from specviz.watch import closing
from specviz.watch.attribution import Emit
from specviz.watch.calls import attended_ids
from specviz.watch.declared import (
    as_int,
    checked_segments,
    checked_temperature,
    checked_trees,
    eos_ids,
    prompt_ids,
    require_emits,
    require_prompted,
)
from specviz.watch.headinput import HiddenTap
from specviz.watch.hooks import Declared, ModelHooks, WatchError, check_causal_lm
from specviz.watch.infer.follow import follow_rows
from specviz.watch.paged import PagedCapture
from specviz.watch.record import CallRecord
from specviz.watch.steps import infer_steps
from specviz.watch.streamer import GenerateStreamer

FINISH_REASONS = (None, "eos", "length")


class Watch:
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
        check_causal_lm(target, "target")
        if draft is not None:
            check_causal_lm(draft, "draft")
            if draft is target:
                raise WatchError("draft and target are the same module; pass draft=None for plain decoding")
        if layout not in LAYOUTS:
            raise WatchError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.prompts = prompt_ids(prompts, tokenizer)
        self.prompt_texts = prompts if prompts and isinstance(prompts[0], str) else None
        self.out = Path(out) if out is not None else None
        self.name = name or "watched"
        self.layout = layout
        self.temperature = checked_temperature(temperature)
        if not isinstance(logits_processed, bool):
            raise WatchError(f"logits_processed must be True or False, got {logits_processed!r}")
        self.logits_processed = logits_processed
        # Greedy on the raw logits: the only case where the target's argmax is the engine's choice
        # and a batch-1 greedy decode of the target is its oracle.
        self.argmax_is_choice = self.temperature == 0 and not logits_processed
        self.created_at = now_iso()
        self._rows: dict[str, tuple[int, ...] | None] = {"target": None, "draft": None}
        self._once: dict[str, Declared] = {}  # by model role, until its next forward takes it
        self._ever_declared = False  # rows or batch called: the engine names its rows
        self._calls: list[CallRecord] = []
        self._emits: list[Emit] = []
        self._closed = False
        self.trace: Trace | None = None  # set by close(): the context manager's result
        tap = None  # the target's last hidden states, to see where the head's input came from
        if drafter is not None:
            if not isinstance(drafter, torch.nn.Module) or drafter is target or drafter is draft:
                raise WatchError("drafter must be a torch module other than the target and the draft (the draft head)")
            tap = HiddenTap(target)
        self._head_named = drafter is not None
        # Everything `close` removes (`ModelHooks`, the tap), in order.
        self._hooks: list[ModelHooks | HiddenTap] = [ModelHooks(target, "target", self, tap=tap)]
        if draft is not None:
            self._hooks.append(ModelHooks(draft, "draft", self))
        if drafter is not None:  # a draft head (EAGLE, MTP, Medusa): any module, fed hidden states
            self._hooks += [ModelHooks(drafter, "draft", self, drafter=True, tap=tap), tap]
        # Always a capture: one that found no continuous batching to wrap names no sequence, so it
        # keeps no emit, reports nothing and adds no EOS id.
        self._paged = PagedCapture(self, self.prompts)
        self._paged.install()

    # ------------------------------------------------------------------ what the hooks call

    def declared(self, role: str = "target") -> Declared:
        """The forward's own declaration (`batch`, the paged manager's requests), taken: it was for
        that one forward. Else the rows `rows` declared for every forward."""
        return self._once.pop(role, None) or Declared(self._rows.get(role))

    def declare_forward(self, seq_ids: tuple[int, ...]) -> None:
        """The paged manager's requests of the next target forward (`paged.PagedCapture`); what
        `batch` declared besides the sequences stays."""
        self._once["target"] = self._once.get("target", Declared())._replace(rows=tuple(seq_ids))

    def add_call(self, call: CallRecord) -> None:
        self._calls.append(call)

    # ------------------------------------------------------------------ the public API

    def rows(self, seq_ids: Iterable[int], *, model: str | None = None) -> None:
        """Declare which sequence each batch row holds from now on, in row order.

        `model="draft"` (or `"target"`) declares one side only, for engines whose draft batch holds
        other rows than the target's; by default both. An undeclared draft side is matched to the
        target rows by what its calls were fed and returned.
        """
        _check_model(model, (None, "target", "draft"), "rows")
        self._require_open("rows")
        ids = self._checked_ids(seq_ids, "rows")
        self._ever_declared = True
        for role in ("target", "draft") if model is None else (model,):
            self._rows[role] = tuple(ids)

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
        """Declare the next forward of `model` only: the sequence of each row (a padded batch) or,
        with `query_lens`, of each packed segment in order (a 1 x T call: sequence i holds the next
        query_lens[i] tokens). For an engine whose batch changes every step; `rows` is the short
        form for a padded batch that keeps its rows.

        `parents` (target): per sequence, the tree its row (segment) verifies (None: none, a prefill
        riding along): node 0 the pending token (parent -1), every other node's parent an earlier
        node, the nodes its last len(parents) real query tokens in that order (docs/watch-trees.md).
        `drafts`: how many draft tokens end each sequence's query (None: not said, read from the
        draft calls). `chunk`: True for a prefill chunk short of its prompt's end: it yields no
        token, so it is no step of its sequence."""
        _check_model(model, ("target", "draft"), "batch")
        self._require_open("batch")
        ids = self._checked_ids(seq_ids, "batch")
        trees = None if parents is None else checked_trees(parents, len(ids), model)
        lens = None if query_lens is None else _checked_lens(query_lens, len(ids))
        facts = None if drafts is None and chunk is None else checked_segments(drafts, chunk, lens, len(ids))
        self._once[model] = Declared(tuple(ids), lens, trees, facts)
        self._ever_declared = True

    def _checked_ids(self, seq_ids: Iterable[int], what: str) -> list[int]:
        ids = [as_int(s, what) for s in seq_ids]
        if len(set(ids)) != len(ids):
            dup = next(s for s in ids if ids.count(s) > 1)
            raise WatchError(f"{what}: sequence {dup} appears twice; each row holds a different sequence")
        for seq_id in ids:
            self._require_known(seq_id, what)
        return ids

    def emit(self, seq_id: int, token_ids: Iterable[int] | torch.Tensor, finish_reason: str | None = None) -> None:
        """Declare the tokens the engine appended to `seq_id` this step ("eos"/"length" when it ends)."""
        self._require_open("emit")
        seq_id = as_int(seq_id, "emit")
        self._require_known(seq_id, "emit")
        if finish_reason not in FINISH_REASONS:
            raise WatchError(f"emit: finish_reason must be None, 'eos' or 'length', got {finish_reason!r}")
        if isinstance(token_ids, torch.Tensor):
            token_ids = token_ids.reshape(-1).tolist()
        tokens = [as_int(t, "emit") for t in token_ids]
        if self._paged.engine_emit(seq_id, tokens, finish_reason):
            return  # the paged manager reports this sequence: compared with its report at close
        self.report(seq_id, tokens, finish_reason)

    def report(self, seq_id: int, tokens: list[int], finish_reason: str | None = None) -> None:
        """Tokens a sequence received: the engine's `emit`, or the paged manager's report."""
        self._emits.append(Emit(seq_id, tokens, finish_reason, after=len(self._calls), at=time.perf_counter()))

    def streamer(self) -> GenerateStreamer:
        """For HF `generate(..., streamer=w.streamer())`: its tokens become `emit` calls."""
        self._require_open("streamer")
        if self.prompts is None:
            raise WatchError("streamer: pass prompts= to watch, so rows map to sequences")
        return GenerateStreamer(self, frozenset(eos_ids(self.target, self.tokenizer)), len(self.prompts))

    def close(self, reference: bool = True, *, complete: bool = True) -> Trace:
        """Remove the hooks, infer the steps, decode the references, write `out`; returns the trace."""
        self._require_open("close")
        self._closed = True
        calls = self._release_hooks()
        if complete:
            require_emits(calls, self._emits)
        # The manager's requests may stop on EOS ids of their own.
        eos = frozenset(eos_ids(self.target, self.tokenizer)) | self._paged.eos_ids
        with collector_paused():
            # Undeclared: the paged manager's requests, else the first target call's rows.
            prompts = self.prompts or self._paged.prompts or _prompts_from_first_call(calls)
            require_prompted(prompts, self._emits)
            if self._rows_to_follow(calls, prompts):
                follow_rows(calls, prompts, eos)
            self._paged.reconcile(calls, self._emits)  # the engine's emits for the manager's sequences
            assembly = infer_steps(calls, self._emits, prompts, eos, argmax_is_choice=self.argmax_is_choice)
            header = closing.header(self, assembly, eos, complete and assembly.unreadable is None)
        del calls  # read: the reference decode below does not need them
        # A sampled or processed run is not token-exact against the raw greedy oracle: none decoded.
        references: list[tuple[Any, Any]] = [(None, None)] * len(prompts)
        if reference and self.argmax_is_choice:
            references = closing.references(self, prompts, assembly, eos)
        with collector_paused():
            trace = Trace(
                header=header, steps=assembly.steps, sequences=closing.sequences(self, prompts, assembly, references)
            )
            if self.tokenizer is not None:  # the piece table: readers of the trace show text, not IDs
                from specviz.trace.token_text import attach_token_text

                attach_token_text(trace, self.tokenizer)
            if self.out is not None:
                save_trace(trace, self.out)
        self.trace = trace
        return trace

    def _release_hooks(self) -> list[CallRecord]:
        """Remove the hooks; returns the captured calls, which the watch no longer holds: the hooks
        point back at it, a cycle only a full garbage collection (hundreds of ms once torch is
        loaded) would free, calls included. Broken here, the calls go with their last reference."""
        for hooks in self._hooks:
            hooks.remove()
        self._hooks = []  # and the last hidden states the tap kept
        self._paged.uninstall()
        calls, self._calls = self._calls, []
        return calls

    def __enter__(self) -> Watch:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """A crash in the engine still leaves a valid trace, marked incomplete (no reference decode)."""
        if self._closed:
            return
        self.close(reference=exc_type is None, complete=exc_type is None)

    # ------------------------------------------------------------------ pieces

    def _require_open(self, what: str) -> None:
        if self._closed:
            raise WatchError(f"{what}: this watch is already closed")

    def _require_known(self, seq_id: int, what: str) -> None:
        if self.prompts is not None and not 0 <= seq_id < len(self.prompts):
            raise WatchError(f"{what}: unknown sequence {seq_id}; prompts are sequences 0..{len(self.prompts) - 1}")
        if seq_id < 0:
            raise WatchError(f"{what}: sequence ids are prompt indices (0, 1, ...), got {seq_id}")

    def _rows_to_follow(self, calls: list[CallRecord], prompts: list[list[int]]) -> bool:
        """No row was ever declared (not by `rows`, `batch` or the paged manager), yet some target
        call holds another number of sequences than there are prompts: the default order (row r
        holds sequence r) cannot be right there, so the rows are followed (`infer.follow.follow_rows`)."""
        for call in calls:
            call.materialize()
        targets = [c for c in calls if c.role == "target"]
        if any(c.rows is not None for c in targets) or self._ever_declared:
            return False
        return any(c.batch_size != len(prompts) for c in targets[1:])


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
    """What `specviz.watch` calls (its docstring and docs/watch.md say what each argument means).

    A sampled (`temperature` > 0) or processed (`logits_processed`) run is matched by what was fed,
    not by the raw argmax, which is nobody's choice there, and asks no equality with the greedy
    oracle. A `drafter`'s drafts are read at each row's pending slot of the verify.
    """
    return Watch(
        target,
        draft,
        tokenizer=tokenizer,
        prompts=prompts,
        out=out,
        name=name,
        layout=layout,
        temperature=temperature,
        logits_processed=logits_processed,
        drafter=drafter,
    )


# ----------------------------------------------------------------------------- helpers


def _check_model(model: str | None, allowed: tuple[str | None, ...], what: str) -> None:
    if model not in allowed:
        names = ", ".join(map(repr, allowed[:-1]))
        raise WatchError(f"{what}: model must be {names} or {allowed[-1]!r}, got {model!r}")


def _checked_lens(query_lens: Iterable[int], count: int) -> list[int]:
    lens = [as_int(n, "batch") for n in query_lens]
    if len(lens) != count or any(n <= 0 for n in lens):
        raise WatchError(f"batch: {count} sequences need {count} query lengths > 0, got {lens}")
    return lens


def first_target(calls: list[CallRecord]) -> CallRecord | None:
    """The first target call, if any."""
    return next((c for c in calls if c.role == "target"), None)


def _prompts_from_first_call(calls: list[CallRecord]) -> list[list[int]]:
    """Without declared prompts: the attended tokens of each row of the first target call."""
    first = first_target(calls)
    if first is None:
        return []
    first.materialize()
    return [attended_ids(first, r) for r in range(first.batch_size)]
