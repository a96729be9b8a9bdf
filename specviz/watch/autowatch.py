"""Watching a script that was never instrumented (docs/watch-command.md): every causal LM it builds
gets hooks, and the two facts `rows` and `emit` would declare are inferred from the calls.

- roles: of the causal LMs that ran a forward, the largest by parameter count is the target (the
  first built wins a tie), the next largest the draft;
- rows, prompts and emits: `infer.follow.Follower` matches each target row to a sequence by its
  attended context; a last step's tokens are what the script decoded (`infer.decoded`), else the
  greedy reading;
- token text: from the first tokenizer built whose vocabulary holds every token the trace uses;
- the draft head, when named (`--drafter NAME`): the first module of that class called outside the
  watched causal LMs, found by a global forward hook that removes itself then; its calls are draft
  calls, its input checked as `watch(target, drafter=head)` checks it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from specviz.analysis.findings import UNREADABLE
from specviz.analysis.unread import READ_AS_GREEDY
from specviz.trace.schema import Trace
from specviz.watch.attribution import Emit
from specviz.watch.declared import eos_ids, pad_id
from specviz.watch.headinput import TapSet, resolve
from specviz.watch.hooks import Declared, ModelHooks, WatchError, check_causal_lm
from specviz.watch.infer.decoded import DecodedLog
from specviz.watch.infer.follow import Follower
from specviz.watch.paged import PagedCapture
from specviz.watch.record import CallRecord
from specviz.watch.session import Watch, first_target
from specviz.watch.view import Unmasked


class AutoWatch:
    """Hooks every causal LM built while installed; `finish` turns what they saw into a trace."""

    def __init__(self, drafter: str | None = None) -> None:
        self.models: list[Any] = []
        self.hooks: list[ModelHooks] = []
        self.calls: list[CallRecord] = []
        self.roles: dict[int, int] = {}  # id(CallRecord) -> index of the model that made it
        self.tokenizers: list[Any] = []  # every tokenizer built while installed, in order
        self.decoded = DecodedLog()  # the id lists the script decoded, to read its last steps
        self._patched: list[tuple[Any, str, Any]] = []  # (class, name, original) to restore
        self.paged = PagedCapture(self, None)  # transformers' continuous batching: its manager says
        self.paged_emits: list[Emit] = []
        self._declared: tuple[int, ...] | None = None
        # The draft head named by class (`--drafter`): searched for by a global forward hook until
        # its first call; every causal LM keeps its last hidden states meanwhile (only when named).
        self.drafter = drafter
        self.head: Any = None
        self.taps = TapSet()  # empty unless a head is named
        self._head_class = ""  # the class's own name, the search's first test (set when it starts)
        self._search: list[Any] = []  # the global hooks' handles while searching
        self._called: dict[int, float] = {}  # id -> start time of the calls of the head's class under way
        self._inside: set[int] | None = None  # ids of the causal LMs' modules (built when a name matches)

    # ------------------------------------------------------------------ what ModelHooks calls

    def declared(self, role: str = "target") -> Declared:
        """Undeclared (`finish` follows the rows by their attended context), except the requests the
        paged manager named for the next forward."""
        rows, self._declared = self._declared, None
        return Declared(rows)

    def add_call(self, call: CallRecord) -> None:
        self.calls.append(call)

    # ------------------------------------------------------------------ what PagedCapture calls

    def declare_forward(self, seq_ids: tuple[int, ...]) -> None:
        self._declared = seq_ids

    def report(self, seq_id: int, token_ids: list[int], finish_reason: str | None = None) -> None:
        at = time.perf_counter()
        self.paged_emits.append(Emit(seq_id, list(token_ids), finish_reason, after=len(self.calls), at=at))

    # ------------------------------------------------------------------ installing

    def install(self) -> None:
        """Patch `PreTrainedModel.post_init`: every HF model calls it at the end of its constructor,
        whether built by `from_pretrained`, `from_config` or directly."""
        from transformers import PreTrainedModel

        original = PreTrainedModel.post_init
        watcher = self

        def post_init(model: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(model, *args, **kwargs)
            watcher.adopt(model)
            return result

        self._patch(PreTrainedModel, "post_init", post_init)
        self._install_tokenizer_capture()
        self.paged.install()
        if self.drafter:
            self._head_class = self.drafter.rsplit(".", 1)[-1]
            hooks = torch.nn.modules.module
            self._search = [
                hooks.register_module_forward_pre_hook(self._head_call_starts),
                hooks.register_module_forward_hook(self._find_head, with_kwargs=True),
            ]

    def _install_tokenizer_capture(self) -> None:
        """Patch `PreTrainedTokenizerBase.__init__` (every HF tokenizer runs it) to keep a reference,
        first used once the script has ended; and `decode`, to log what the script decoded."""
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase

        original = PreTrainedTokenizerBase.__init__
        watcher = self

        def init(tokenizer: Any, *args: Any, **kwargs: Any) -> None:
            original(tokenizer, *args, **kwargs)
            if not any(t is tokenizer for t in watcher.tokenizers):
                watcher.tokenizers.append(tokenizer)

        self._patch(PreTrainedTokenizerBase, "__init__", init)
        # The ids a script decodes (`batch_decode` calls `decode`) show a last step's tokens.
        self._patch(PreTrainedTokenizerBase, "decode", self.decoded.wrap(PreTrainedTokenizerBase.decode))

    def _patch(self, owner: type, name: str, replacement: Any) -> None:
        self._patched.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def uninstall(self) -> None:
        """Restore what `install` patched and remove every hook (twice is harmless: `cli` calls it
        when the script ends, `finish` again)."""
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched = []
        self._stop_search()
        for hooks in self.hooks:  # the head's too, once found
            hooks.remove()
        self.taps.remove()
        self.paged.uninstall()

    def adopt(self, model: Any) -> None:
        """Hook `model` if it is a causal LM (base models and encoders are skipped silently)."""
        if any(m is model for m in self.models) or self._is_head_class(model):
            return  # a causal LM of the head's class is left to the search: it is the head
        try:
            check_causal_lm(model, "model")
        except WatchError:
            return
        index = len(self.models)
        self.models.append(model)
        self._inside = None
        tap = self.taps.add(index, model) if self.drafter else None
        # Every model records as a target (argmax of all query slots); draft calls are trimmed later.
        self.hooks.append(_IndexedHooks(model, self, index, tap))

    # ------------------------------------------------------------------ the draft head

    def _is_head_class(self, module: Any) -> bool:
        """`--drafter` names the class, or ends its full name at a dot (not myzoo.X for zoo.X)."""
        if not self.drafter:
            return False
        kind = type(module)
        full = f"{kind.__module__}.{kind.__qualname__}"
        return full == self.drafter or full.endswith("." + self.drafter)

    def _stop_search(self) -> None:
        for handle in self._search:
            handle.remove()
        self._search, self._called = [], {}

    def _head_call_starts(self, module: Any, args: tuple[Any, ...]) -> None:
        """Global pre-hook while searching: when a call of the head's class starts, for its time."""
        if type(module).__name__ == self._head_class:
            self._called[id(module)] = time.perf_counter()

    def _find_head(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """Global forward hook while searching: the first module of the named class called outside
        the causal LMs (or inside one, returning logits: `_in_forward_head`) is the head. Its hooks
        go on, this call (read here: the global pre-hook sees no keywords; timed from its start) is
        its first, and the search ends."""
        if type(module).__name__ != self._head_class:
            return  # the one test every module call pays until the head is found
        started = self._called.pop(id(module), None)
        if not self._is_head_class(module):
            return
        if self._inside is None:
            self._inside = {id(m) for model in self.models for m in model.modules()}
        if id(module) in self._inside and not self._in_forward_head(module, output):
            return  # part of the target or the draft (a layer of that name), not a head
        self._stop_search()
        self.head = module
        hooks = ModelHooks(module, "draft", self, drafter=True, tap=self.taps)
        self.hooks.append(hooks)
        hooks.before(module, args, kwargs)
        if hooks.open[-1] is not None and started is not None:
            hooks.open[-1].started = started
        hooks.after(module, args, kwargs, output)

    def _in_forward_head(self, module: Any, output: Any) -> bool:
        """A module of the named class inside a causal LM is its head only when it returns logits
        (last dimension that model's vocabulary) and is not the model's own LM head: an MTP-like
        head the model's forward calls on its final hidden states, not a layer of that name."""
        logits = getattr(output, "logits", None)
        if logits is None:  # a tuple's first item, or the output itself
            logits = output[0] if isinstance(output, (tuple, list)) and output else output
        if not isinstance(logits, torch.Tensor) or logits.dim() < 2:
            return False
        for model in self.models:  # causal LMs (`adopt`): each has its LM head
            vocab = getattr(getattr(model, "config", None), "vocab_size", None)
            head = model.get_output_embeddings()
            if module is not head and logits.shape[-1] == vocab and any(m is module for m in model.modules()):
                return True
        return False

    # ------------------------------------------------------------------ finishing

    def pick_roles(self) -> tuple[Any, Any | None]:
        """Target: the largest causal LM that ran; draft: the next largest, if any."""
        ran = {self.roles[id(c)] for c in self.calls if not c.drafter}
        if not ran:
            raise WatchError("the script ran no forward call of a causal LM built while it ran")
        ranked = sorted(ran, key=lambda i: (-_parameters(self.models[i]), i))
        draft = self.models[ranked[1]] if len(ranked) > 1 else None
        return self.models[ranked[0]], draft

    def finish(self, out: Path, name: str, layout: str, reference: bool, complete: bool) -> tuple[Trace, list[str]]:
        """Remove the hooks, infer prompts and emits, assemble and write the trace; also the notes."""
        self.uninstall()
        target, draft = self.pick_roles()
        notes: list[str] = []
        unfollowed: list[str] = []
        assumed: dict[int, int] = {}  # sequence -> tokens of its last step no later call showed
        calls = self._relabel(target, draft)
        eos = frozenset(eos_ids(target, None))
        if self.paged.seq_of:  # the paged manager named every request and its tokens: nothing to infer
            prompts, emits = self.paged.prompts, self.paged_emits
        else:
            decoded = (self.decoded, pad_id(target, None))
            prompts, emits = infer(calls, eos, notes, unfollowed, assumed, decoded)
            prompts = unpadded_prompts(prompts, calls, pad_id(target, None))
        # Notes so far say where reading stopped: what follows is unread, so sequences may be
        # unfinished without the engine being at fault; the trace says it is incomplete.
        read_all = not notes
        if assumed and self.decoded.full:  # some last steps read as greedy may be in the lists left out
            notes.append(self.decoded.note())
        if self.drafter and self.head is None:  # never silent: the head-input check did not run
            notes.append(
                f"--drafter {self.drafter}: no module of that class was called outside the causal LMs "
                "(or inside one, returning its logits); "
                "drafts were read from the verify, the head's input was not checked"
            )
        # No `out` for the watch: the trace is written once, below, with what only the command knows.
        w = Watch(target, draft, prompts=prompts, name=name, layout=layout)
        w._head_named = self.head is not None  # its calls are in `calls`: the header says "head"
        w._paged.eos_ids |= self.paged.eos_ids  # the manager's EOS ids, as the script's manager saw them
        # The inferred calls and emits stand in for what the hooks and `emit` would have collected.
        w._calls, w._emits = calls, emits
        trace = w.close(reference=reference and complete, complete=complete and read_all)
        tokenizer = self.tokenizer_for(trace)
        if tokenizer is not None:
            from specviz.trace.token_text import attach_token_text

            attach_token_text(trace, tokenizer)
        options = trace.header.options
        said = {  # written only where they say something, as the header's own options
            # Read, not seen: the report says so beside the exact match (analysis/unread.py).
            READ_AS_GREEDY: {str(seq): n for seq, n in sorted(assumed.items())},
            "watch_notes": [*options.get("watch_notes", []), *notes[:20]],
            # The run is unreadable from there: `check` says so, with its own exit code.
            UNREADABLE: unfollowed and {"step": len(trace.steps), "why": "; ".join(unfollowed)},
        }
        options.update({key: value for key, value in said.items() if value})
        from specviz.trace.io import save_trace

        save_trace(trace, out)
        return trace, notes

    def tokenizer_for(self, trace: Trace) -> Any | None:
        """The first tokenizer built whose vocabulary holds every token ID the trace uses."""
        from specviz.trace.token_text import trace_token_ids

        largest = max(trace_token_ids(trace), default=-1)
        for tokenizer in self.tokenizers:
            try:
                if len(tokenizer) > largest:
                    return tokenizer
            except TypeError:  # a tokenizer without a length: its vocabulary is unknown
                continue
        return None

    def _relabel(self, target: Any, draft: Any | None) -> list[CallRecord]:
        """Only the two models' calls, with roles; a draft keeps the argmax of its last slot."""
        kept = []
        index = next(i for i, m in enumerate(self.models) if m is target)
        role_of = {id(target): "target", id(draft): "draft"}  # any other model's calls are dropped
        for call in self.calls:
            if call.drafter:  # the head's: matched with every model's hidden states, the target's kept
                call.head_fed = resolve(call.head_fed, index)
                kept.append(call)
                continue
            role = role_of.get(id(self.models[self.roles[id(call)]]))
            if role is not None:
                call.role = role
                kept.append(call)
        return kept


class _IndexedHooks(ModelHooks):
    """ModelHooks that also remember which model made each call."""

    def __init__(self, model: Any, watcher: AutoWatch, index: int, tap: Any = None) -> None:
        super().__init__(model, "target", watcher, tap=tap)
        self.index = index
        self.watcher = watcher

    def after(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        count = len(self.watcher.calls)
        super().after(module, args, kwargs, output)
        for call in self.watcher.calls[count:]:
            self.watcher.roles[id(call)] = self.index


def _parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------- inference


def infer(
    calls: list[CallRecord],
    eos: frozenset[int],
    notes: list[str],
    unfollowed: list[str] | None = None,
    assumed: dict[int, int] | None = None,
    decoded: tuple[DecodedLog, int | None] | None = None,
) -> tuple[list[list[int]], list[Emit]]:
    """Prompts (by sequence id) and the emits a correct-bookkeeping engine would have declared, rows
    followed by `infer.follow.Follower`. Why rows could not be followed goes to `notes` and
    `unfollowed`; `assumed` gets each sequence's count of last-step tokens no later call showed,
    fewer where `decoded` (what the script decoded, the engine's pad id) shows them."""
    for call in calls:
        call.materialize()
    if not any(c.role == "target" for c in calls):
        raise WatchError("the target ran no forward call with input_ids")
    follower = Follower(calls, eos, notes)
    follower.run()
    if decoded is not None:
        log, pad = decoded
        follower.take_decoded(log.lists, pad)
    if unfollowed is not None:
        unfollowed.extend(follower.unfollowed)
    if assumed is not None:
        assumed.update(follower.read_as_greedy)
    return follower.prompts, follower.emits


def unpadded_prompts(prompts: list[list[int]], calls: list[CallRecord], pad: int | None) -> list[list[int]]:
    """The first target call's prompts without their left padding, when it was fed no mask (every
    slot then reads as attended): the trace and the diagnosis (a row attending its padding) are then
    those of the `specviz.watch` API, which is given the prompts. Only a rectangular batch whose rows
    start with pad runs of different lengths, one of them none, is stripped; else kept as read."""
    first = first_target(calls)  # there is one: `infer` read it
    if pad is None or not isinstance(first.view(0), Unmasked):  # (a packed call's segments: no padding)
        return prompts
    opened = prompts[: first.batch_size]
    leads = [next((i for i, t in enumerate(p) if t != pad), len(p)) for p in opened]
    if len({len(p) for p in opened}) != 1 or min(leads) != 0 or max(leads) == 0:
        return prompts
    return [p[lead:] or p for p, lead in zip(opened, leads)] + prompts[first.batch_size :]
