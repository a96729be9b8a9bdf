"""Watching a script that was never instrumented (`specviz watch --`, docs/watch-command.md): every
causal LM it builds gets hooks, and what `rows` and `emit` would declare is inferred from the calls.
The largest model that ran is the target, the next the draft; a head named by class (`--drafter`) is
found by a global forward hook; the token text is the first tokenizer built that covers the trace."""

from __future__ import annotations

import time
from itertools import dropwhile
from pathlib import Path
from typing import Any

import torch

from specviz.analysis.findings import UNREADABLE
from specviz.analysis.unread import READ_AS_GREEDY
from specviz.trace.io import save_trace
from specviz.trace.schema import Trace
from specviz.trace.token_text import attach_token_text, trace_token_ids
from specviz.watch.attribution import Emit
from specviz.watch.declared import eos_ids, pad_id
from specviz.watch.headinput import TapSet, resolve
from specviz.watch.hooks import NO_TAP, Declared, ModelHooks, WatchError, check_causal_lm, logits_of
from specviz.watch.infer.decoded import DecodedLog
from specviz.watch.infer.follow import Follower
from specviz.watch.paged import PagedCapture, Patches
from specviz.watch.record import CallRecord
from specviz.watch.session import Recorder, Watch
from specviz.watch.view import Unmasked


class AutoWatch(Recorder):
    """Hooks every causal LM built while installed; `finish` turns what they saw into a trace."""

    def __init__(self, drafter: str | None = None) -> None:
        super().__init__()
        self.models: list[Any] = []  # each records its calls under its index as their role (`_relabeled`)
        self.hooks: list[ModelHooks] = []
        self.tokenizers: list[Any] = []  # every tokenizer built while installed, in order
        self.decoded = DecodedLog()  # the id lists the script decoded, to read its last steps
        self._patched = Patches()  # what `install` replaced, restored by `uninstall`
        self.paged = PagedCapture(self, None)  # transformers' continuous batching: its manager says
        # `--drafter`: the head is searched for by global hooks until its first call; meanwhile
        # every causal LM keeps its last hidden states (`taps`).
        self.drafter, self.taps = drafter, TapSet()
        self.head: Any = None
        self._unfound: list[str] = []  # the note that `--drafter` named no head called, until one is
        self._search: list[Any] = []  # the global hooks' handles while searching
        self._called: dict[int, float] = {}  # id(module) -> start time of its call under way
        self._inside: set[int] | None = None  # ids of the causal LMs' modules (built when a name matches)

    def install(self) -> None:
        """Patch `PreTrainedModel.post_init`, which every HF model's constructor ends with, and the
        tokenizers' `__init__` (to keep each) and `decode` (to log what the script decoded)."""
        from transformers import PreTrainedModel
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase as Tokenizer

        self._patched.after(PreTrainedModel, "post_init", lambda model, *_, **__: self.adopt(model))
        # (a tokenizer kept twice changes nothing: the first that fits is taken)
        self._patched.after(Tokenizer, "__init__", lambda tokenizer, *_, **__: self.tokenizers.append(tokenizer))
        self._patched.replace(Tokenizer, "decode", self.decoded.wrap(Tokenizer.decode))  # `batch_decode` calls it
        self.paged.install()
        if self.drafter:
            self._head_class = self.drafter.rsplit(".", 1)[-1]
            self._unfound = [
                f"--drafter {self.drafter}: no module of that class was called outside the causal LMs "
                "(or inside one, returning its logits); "
                "drafts were read from the verify, the head's input was not checked"
            ]
            hooks = torch.nn.modules.module
            self._search = [
                hooks.register_module_forward_pre_hook(self._head_call_starts),
                hooks.register_module_forward_hook(self._find_head, with_kwargs=True),
            ]

    def uninstall(self) -> None:
        """Restore what `install` patched, remove every hook (`cli` and `finish` call it: twice is harmless)."""
        self._patched.restore()
        self._stop_search()
        for hooks in self.hooks:  # the head's too, once found
            hooks.remove()
        self.taps.remove()
        self.paged.uninstall()

    def adopt(self, model: Any) -> None:
        """Hook `model` if it is a causal LM (base models and encoders are skipped silently)."""
        if any(m is model for m in self.models):
            return
        try:
            check_causal_lm(model, "model")
        except WatchError:
            return
        tap = NO_TAP
        if self.drafter:
            if self._is_head_class(model):
                return  # a causal LM of the head's class is left to the search: it is the head
            tap = self.taps.add(len(self.models), model)
        # Every model records as a target (argmax of all query slots) under its index; draft calls are
        # trimmed later.
        self.hooks.append(ModelHooks(model, str(len(self.models)), self, tap=tap))
        self.models.append(model)
        self._inside = None

    def declared(self, role: str = "target") -> Declared:
        """The paged manager's requests are for the next call of any model (each has its own role)."""
        return super().declared("target")

    # ------------------------------------------------------------------ the draft head

    def _is_head_class(self, module: Any) -> bool:
        """`--drafter` names the class, or ends its full name at a dot (not myzoo.X for zoo.X)."""
        kind = type(module)
        return f".{kind.__module__}.{kind.__qualname__}".endswith("." + self.drafter)

    def _stop_search(self) -> None:
        for handle in self._search:
            handle.remove()
        self._search, self._called = [], {}

    def _head_call_starts(self, module: Any, args: tuple[Any, ...]) -> None:
        """Global pre-hook while searching: when each module's call started."""
        self._called[id(module)] = time.perf_counter()

    def _find_head(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """Global forward hook while searching: the first module of the named class called outside
        the causal LMs (or inside one, returning logits) is the head; this call is its first."""
        started = self._called.pop(id(module), time.perf_counter())
        if type(module).__name__ != self._head_class or not self._is_head_class(module):
            return  # the name: the one test every module call pays until the head is found
        if self._inside is None:
            self._inside = {id(m) for model in self.models for m in model.modules()}
        if id(module) in self._inside and not self._in_forward_head(module, output):
            return  # part of the target or the draft (a layer of that name), not a head
        self._stop_search()
        self.head, self._unfound = module, []
        hooks = ModelHooks(module, "draft", self, drafter=True, tap=self.taps)
        self.hooks.append(hooks)
        hooks.before(module, args, kwargs)
        if hooks.open[-1] is not None:
            hooks.open[-1].started = started
        hooks.after(module, args, kwargs, output)

    def _in_forward_head(self, module: Any, output: Any) -> bool:
        """Inside a causal LM, a module of the named class is a head (MTP-like) only when it returns
        that model's logits and is not its LM head; else it is a layer of that name."""
        logits = logits_of(output)
        if not isinstance(logits, torch.Tensor) or logits.dim() < 2:
            return False
        return any(
            module is not model.get_output_embeddings()
            and logits.shape[-1] == getattr(getattr(model, "config", None), "vocab_size", None)
            and any(m is module for m in model.modules())
            for model in self.models
        )

    # ------------------------------------------------------------------ finishing

    def finish(self, out: Path, name: str, layout: str, reference: bool, complete: bool) -> tuple[Trace, list[str]]:
        """Remove the hooks, infer prompts and emits, assemble and write the trace; also the notes."""
        self.uninstall()
        target, draft, calls = self._relabeled()
        notes: list[str] = []
        # The paged manager named every request; else `Follower` reads them (and which last steps it
        # read as greedy: sequence -> tokens no later call showed).
        prompts, emits, unfollowed, assumed = self.paged.prompts, self._emits, [], {}
        if not self.paged.seq_of:
            follower, pad = _followed(calls, frozenset(eos_ids(target, None)), notes), pad_id(target, None)
            follower.take_decoded(self.decoded.lists, pad)
            prompts = unpadded_prompts(follower.prompts, calls, pad)
            emits, unfollowed, assumed = follower.emits, follower.unfollowed, follower.read_as_greedy
        read_all = not notes  # else reading stopped: the trace is incomplete
        if assumed and self.decoded.full:  # some last steps read as greedy may be in the lists left out
            notes.append(self.decoded.note())
        notes += self._unfound  # never silent: the head-input check did not run
        # The inferred calls and emits stand in for what the hooks and `emit` would have collected;
        # the trace is written below, with what only the command knows.
        w = Watch(target, draft, prompts=prompts, name=name, layout=layout, drafter=self.head)
        w._paged.eos_ids |= self.paged.eos_ids  # the manager's EOS ids, as the script's manager saw them
        w._calls, w._emits = calls, emits
        trace = w.close(reference=reference and complete, complete=complete and read_all)
        self._attach_token_text(trace)
        options = trace.header.options
        said = {  # written only where they say something, as the header's own options
            READ_AS_GREEDY: {str(seq): n for seq, n in sorted(assumed.items())},
            "watch_notes": [*options.get("watch_notes", []), *notes[:20]],
            UNREADABLE: unfollowed and {"step": len(trace.steps), "why": "; ".join(unfollowed)},
        }
        options.update({key: value for key, value in said.items() if value})
        save_trace(trace, out)
        return trace, notes

    def _attach_token_text(self, trace: Trace) -> None:
        """The token text, by the first tokenizer built whose vocabulary holds every ID the trace uses."""
        largest = max(trace_token_ids(trace), default=-1)
        for tokenizer in self.tokenizers:
            try:
                fits = len(tokenizer) > largest
            except TypeError:  # a tokenizer without a length: its vocabulary is unknown
                continue
            if fits:
                attach_token_text(trace, tokenizer)
                return

    def _relabeled(self) -> tuple[Any, Any | None, list[CallRecord]]:
        """The target (the largest causal LM that ran), the draft (the next, if any) and only their
        calls, with roles; the head's calls keep the target's hidden-state matches."""
        ran = {c.role for c in self._calls} - {"draft"}  # the models' indices (the head's calls are "draft")
        if not ran:
            raise WatchError("the script ran no forward call of a causal LM built while it ran")
        ranked = sorted(ran, key=lambda i: (-sum(p.numel() for p in self.models[int(i)].parameters()), int(i)))
        role_of = dict(zip(ranked, ("target", "draft")))  # any other model's calls are dropped
        kept, before = [], [0]  # before[i]: the calls kept among the first i
        for call in self._calls:
            if call.drafter:  # the head's: matched with every model's hidden states, the target's kept
                call.head_fed = resolve(call.head_fed, int(ranked[0]))
                kept.append(call)
            elif call.role in role_of:
                call.role = role_of[call.role]
                kept.append(call)
            before.append(len(kept))
        # The manager's reports counted every model's calls: counted again over the calls kept.
        for emit in self._emits:
            emit.after = before[emit.after]
        model = {role: self.models[int(i)] for i, role in role_of.items()}
        return model["target"], model.get("draft"), kept


def infer(
    calls: list[CallRecord], eos: frozenset[int], notes: list[str], unfollowed: list[str] | None = None
) -> tuple[list[list[int]], list[Emit]]:
    """Prompts and the emits a correct engine would have declared, rows followed by `Follower`; why
    not goes to `notes` and `unfollowed`."""
    follower = _followed(calls, eos, notes)
    if unfollowed is not None:
        unfollowed.extend(follower.unfollowed)
    return follower.prompts, follower.emits


def _followed(calls: list[CallRecord], eos: frozenset[int], notes: list[str]) -> Follower:
    """The calls read (`CallRecord.materialize`, the target's: `_relabeled` kept one) and followed."""
    for call in calls:
        call.materialize()
    follower = Follower(calls, eos, notes)
    follower.run()
    return follower


def unpadded_prompts(prompts: list[list[int]], calls: list[CallRecord], pad: int | None) -> list[list[int]]:
    """The first target call's prompts without their left padding when it was fed no mask (every slot
    reads as attended), as the API, given the prompts, would read them: only a rectangular batch whose
    rows start with pad runs, one of them none (no pad id, or no row padded: nothing is stripped)."""
    first = next(c for c in calls if c.role == "target")  # there is one: `_relabeled` kept it
    if not isinstance(first.views[0], Unmasked):  # (a packed call's segments: no padding)
        return prompts
    opened = prompts[: first.batch_size]
    leads = [len(p) - len(list(dropwhile(lambda t: t == pad, p))) for p in opened]
    if len({len(p) for p in opened}) != 1 or min(leads) != 0:
        return prompts
    return [p[lead:] or p for p, lead in zip(opened, leads)] + prompts[first.batch_size :]
