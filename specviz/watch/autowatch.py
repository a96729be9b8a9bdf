"""Watching a script that was never instrumented: every causal LM it builds gets hooks, and the
two facts `rows` and `emit` would declare are inferred from the calls instead.

What is inferred (see docs/watch.md, "Watching an unmodified script"):
- roles: of the causal LMs that ran a forward, the largest by parameter count is the target
  (the first built wins a tie), the next largest the draft;
- token text: the first tokenizer the script built whose vocabulary holds every token the trace
  uses gives the trace its piece table (`header.token_text`), so `check` and the app show text;
- rows: row r holds sequence r for the whole run (rows keep their order, the batch never shrinks);
- prompts: each row's attended input ids in the target's first call; when the second target call
  does not feed the first call's argmax as its pending token, the first call was a prefill of all
  but the last prompt token, and that pending token completes the prompt;
- emits: for a target call followed by another, a row gained as many tokens as its attended
  context grew: read from the next call's query where it re-feeds them (recompute loops), else
  the accepted drafts then the next call's pending token (the drafts agreeing with the target's
  argmax when the growth does not fit); after the row's last call (the last call, or the next
  one feeds it only padding), the drafts agreeing with the argmax plus the argmax after them
  (greedy). A row whose query is all padding is idle; one fed again without growing has finished.
  A token in the EOS set ends the sequence.
"""

from __future__ import annotations

from typing import Any

from specviz.trace.schema import Trace
from specviz.watch.calls import (
    CallReader,
    RowQuery,
    argmax_at,
    context_before,
    draft_free_query,
    last_slot,
    query_flags,
)
from specviz.watch.hooks import CallRecord, ModelHooks, WatchError, check_causal_lm
from specviz.watch.session import Watch, _eos_ids
from specviz.watch.steps import Emit, matched_prefix, row_tokens


class AutoWatch:
    """Hooks every causal LM built while installed; `finish` turns what they saw into a trace."""

    def __init__(self) -> None:
        self.models: list[Any] = []
        self.hooks: list[ModelHooks] = []
        self.calls: list[CallRecord] = []
        self.roles: dict[int, int] = {}  # id(CallRecord) -> index of the model that made it
        self.tokenizers: list[Any] = []  # every tokenizer built while installed, in order
        self._original: Any = None
        self._original_tokenizer_init: Any = None

    # ------------------------------------------------------------------ what ModelHooks calls

    def current_rows(self, role: str = "target") -> None:
        return None  # rows keep their order: row r is sequence r

    def add_call(self, call: CallRecord) -> None:
        self.calls.append(call)

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

        self._original = original
        PreTrainedModel.post_init = post_init
        self._install_tokenizer_capture()

    def _install_tokenizer_capture(self) -> None:
        """Patch `PreTrainedTokenizerBase.__init__`: every HF tokenizer runs it, however it is built.
        Only a reference is kept; the tokenizer is first used once the script has ended."""
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase

        original = PreTrainedTokenizerBase.__init__
        watcher = self

        def init(tokenizer: Any, *args: Any, **kwargs: Any) -> None:
            original(tokenizer, *args, **kwargs)
            if not any(t is tokenizer for t in watcher.tokenizers):
                watcher.tokenizers.append(tokenizer)

        self._original_tokenizer_init = original
        PreTrainedTokenizerBase.__init__ = init

    def uninstall(self) -> None:
        from transformers import PreTrainedModel

        if self._original is not None:
            PreTrainedModel.post_init = self._original
            self._original = None
        if self._original_tokenizer_init is not None:
            from transformers.tokenization_utils_base import PreTrainedTokenizerBase

            PreTrainedTokenizerBase.__init__ = self._original_tokenizer_init
            self._original_tokenizer_init = None
        for hooks in self.hooks:
            hooks.remove()

    def adopt(self, model: Any) -> None:
        """Hook `model` if it is a causal LM (base models and encoders are skipped silently)."""
        if any(m is model for m in self.models):
            return
        try:
            check_causal_lm(model, "model")
        except WatchError:
            return
        index = len(self.models)
        self.models.append(model)
        # Every model records as a target (argmax of all query slots); draft calls are trimmed later.
        self.hooks.append(_IndexedHooks(model, self, index))

    # ------------------------------------------------------------------ finishing

    def pick_roles(self) -> tuple[Any, Any | None]:
        """Target: the largest causal LM that ran; draft: the next largest, if any."""
        ran = sorted({self.roles[id(c)] for c in self.calls})
        if not ran:
            raise WatchError("the script ran no forward call of a causal LM built while it ran")
        ranked = sorted(ran, key=lambda i: (-_parameters(self.models[i]), i))
        draft = self.models[ranked[1]] if len(ranked) > 1 else None
        return self.models[ranked[0]], draft

    def finish(self, out: Any, name: str, layout: str, reference: bool, complete: bool) -> tuple[Trace, list[str]]:
        """Remove the hooks, infer prompts and emits, assemble and write the trace; also the notes."""
        self.uninstall()
        target, draft = self.pick_roles()
        notes: list[str] = []
        calls = self._relabel(target, draft)
        eos = frozenset(_eos_ids(target, None))
        prompts, emits = infer(calls, eos, notes)
        # Notes so far say where reading stopped: what follows is unread, so sequences may be
        # unfinished without the engine being at fault; the trace says it is incomplete.
        read_all = not notes
        w = Watch(target, draft, prompts=prompts, out=out, name=name, layout=layout)
        # The inferred calls and emits stand in for what the hooks and `emit` would have collected.
        w._calls, w._emits = calls, emits
        trace = w.close(reference=reference and complete, complete=complete and read_all)
        tokenizer = self.tokenizer_for(trace)
        if tokenizer is not None:
            from specviz.trace.token_text import attach_token_text

            attach_token_text(trace, tokenizer)
        if notes or tokenizer is not None:
            if notes:
                trace.header.options.setdefault("watch_notes", []).extend(notes[:20])
            if w.out is not None:
                from specviz.trace.io import save_trace

                save_trace(trace, w.out)
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
        for call in self.calls:
            model = self.models[self.roles[id(call)]]
            if model is target:
                call.role = "target"
            elif model is draft:
                call.role = "draft"
            else:
                continue
            kept.append(call)
        return kept


class _IndexedHooks(ModelHooks):
    """ModelHooks that also remember which model made each call."""

    def __init__(self, model: Any, watcher: AutoWatch, index: int) -> None:
        super().__init__(model, "target", watcher)
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


def target_calls(calls: list[CallRecord], read: CallReader, notes: list[str]) -> list[int]:
    """Indices of the target calls of the first decode: same batch, until a fresh prefill.

    A call without a cache continues the decode when every row re-feeds its sequence (prompt
    first, then more than the prompt before its pending token): a cacheless or recompute loop.
    """
    indices = [i for i, c in enumerate(calls) if c.role == "target"]
    if not indices:
        return []
    batch = calls[indices[0]].batch_size
    kept = [indices[0]]
    prompts = [_attended_ids(calls[indices[0]], r, read(indices[0], r).pending) for r in range(batch)]
    for i in indices[1:]:
        call = calls[i]
        if call.batch_size != batch:
            notes.append(f"target call {i} has batch {call.batch_size}, not {batch}: later calls ignored")
            break
        if call.cache_width == 0 and not _refeeds(call, i, read, prompts):
            notes.append(f"target call {i} starts a new decode (no cache, a fresh prompt): later calls ignored")
            break
        kept.append(i)
    return kept


def _refeeds(call: CallRecord, index: int, read: CallReader, prompts: list[list[int]]) -> bool:
    for r, prompt in enumerate(prompts):
        fed = _attended_ids(call, r, read(index, r).pending)
        if len(fed) < len(prompt) or fed[: len(prompt)] != prompt:
            return False
    return any(len(_attended_ids(call, r, read(index, r).pending)) > len(p) for r, p in enumerate(prompts))


def infer(calls: list[CallRecord], eos: frozenset[int], notes: list[str]) -> tuple[list[list[int]], list[Emit]]:
    """Prompts (sequence r = row r) and the emits a correct-bookkeeping engine would have declared."""
    for call in calls:
        call.materialize()
    read = CallReader(calls)
    steps = target_calls(calls, read, notes)
    if not steps:
        raise WatchError("the target ran no forward call with input_ids")
    first = calls[steps[0]]
    prompts = [_attended_ids(first, r, read(steps[0], r).pending) for r in range(first.batch_size)]
    if len(steps) > 1 and not _feeds_argmax(first, steps[0], calls[steps[1]], steps[1], read):
        # The first call was a prefill of all but the last prompt token: not a step.
        second = calls[steps[1]]
        for r, prompt in enumerate(prompts):
            prompt.append(second.input_ids[r][read(steps[1], r).pending])
        steps = steps[1:]
    committed = [list(p) for p in prompts]  # each row's tokens so far: prompt, then what it gained
    draft_free = not any(c.role == "draft" for c in calls)
    finished = [False] * len(prompts)
    emits: list[Emit] = []
    for j, index in enumerate(steps):
        call = calls[index]
        following = steps[j + 1] if j + 1 < len(steps) else None
        for r in range(call.batch_size):
            if finished[r] or not any(query_flags(call, r)):
                continue  # finished, or idle in this call (its query is all padding)
            tokens = _gained(calls, read, index, following, r, committed[r], draft_free)
            if not tokens:  # fed again without growing: the engine keeps computing a finished row
                finished[r] = True
                continue
            cut = next((n + 1 for n, t in enumerate(tokens) if t in eos), None)
            tokens = tokens[:cut] if cut else tokens
            finished[r] = cut is not None
            committed[r] += tokens
            emits.append(Emit(r, tokens, "eos" if cut else None, after=index + 1, at=call.ended))
    return prompts, emits


def _first_slot_query(call: CallRecord, row: int) -> RowQuery | None:
    """A cached call's row with no draft model: its first real query slot is the pending token
    (the cache holds the tokens before it), the rest are drafts."""
    flags = query_flags(call, row)
    first = next((j for j, keep in enumerate(flags) if keep), None)
    last = last_slot(call, row)
    if first is None or not all(flags[first : last + 1]):
        return None
    return RowQuery(first, last - first, ())


def _attended_ids(call: CallRecord, row: int, end: int | None = None) -> list[int]:
    """The row's real query tokens up to query slot `end` (default: all of them)."""
    flags = query_flags(call, row)
    stop = len(flags) if end is None else end + 1
    ids = [t for t, keep in zip(call.input_ids[row][:stop], flags[:stop]) if keep]
    return ids or [0]


def _feeds_argmax(first: CallRecord, i: int, second: CallRecord, j: int, read: CallReader) -> bool:
    """Is the first call a step: it verified drafts, or the second call feeds its last argmax as pending?"""
    if first.argmax is None:
        return True
    for r in range(first.batch_size):
        if read(i, r).drafts:
            return True
        last = last_slot(first, r)
        if argmax_at(first, r, last) != second.input_ids[r][read(j, r).pending]:
            return False
    return True


def _gained(
    calls: list[CallRecord],
    read: CallReader,
    index: int,
    following: int | None,
    r: int,
    history: list[int],
    draft_free: bool,
) -> list[int]:
    """Tokens row r's sequence (`history` so far) received in the step of target call `index`."""
    call = calls[index]
    committed = len(history)
    rq = read(index, r)
    if draft_free and not rq.drafts:  # no draft model: the drafts are what follows the committed tokens
        rq = draft_free_query(call, r, history) or rq
    drafts, targets = row_tokens(call, r, rq)
    agreed = matched_prefix(drafts, targets) if targets else 0
    if following is None or not any(query_flags(calls[following], r)):  # its last step: greedy
        return drafts[:agreed] + ([targets[agreed]] if targets else [])
    nxt, nq = calls[following], read(following, r)
    if draft_free:
        if nxt.cache_width == 0:  # re-fed with its own drafts, which only the greedy rule tells apart
            return drafts[:agreed] + ([targets[agreed]] if targets else [])
        nq = _first_slot_query(nxt, r) or nq
    pending = nxt.input_ids[r][nq.pending]
    grown = context_before(nxt, r, nq.pending) + 1 - committed
    if grown == 0:
        return []
    fed = _attended_ids(nxt, r, nq.pending)
    if 1 <= grown <= len(fed):
        return fed[len(fed) - grown :]  # re-fed tokens (a recompute loop) show themselves
    accepted = grown - 1 if 1 <= grown <= len(drafts) + 1 else (agreed or 0)
    return drafts[:accepted] + [pending]
