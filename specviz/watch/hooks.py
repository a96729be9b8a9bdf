"""Forward hooks: what one model call was fed, copied without touching the engine or the host.

Small device tensors per call (docs/watch-heads.md, "What a forward keeps"); `CallRecord.materialize`
turns them into lists at close, the only host sync the watch adds."""

from __future__ import annotations

import inspect
import itertools
import time
import weakref
from typing import Any, NamedTuple, Protocol

import torch

from specviz.errors import SpecvizError
from specviz.watch.content import KeyCopies
from specviz.watch.record import CallRecord
from specviz.watch.tensor_reads import QUERY_TAIL, argmax_of, mask_copy, through_host

SEGMENT_TAIL = 16  # a long packed row keeps the argmax of each sequence's last slots (drafts, pending)


class WatchError(SpecvizError):
    """Bad use of `specviz.watch`: the message says what to change."""


class Declared(NamedTuple):
    """What was said of one forward before it ran: each row's sequence, and `w.batch`'s facts."""

    rows: tuple[int, ...] | None = None
    query_lens: list[int] | None = None
    parents: list[list[int]] | None = None
    facts: tuple[tuple[int | None, bool], ...] | None = None


class CallSink(Protocol):
    """Where `ModelHooks` sends what it captures (the `Watch`, or `AutoWatch` for the CLI)."""

    def declared(self, role: str = "target") -> Declared: ...  # of `role`'s next forward, read once
    def add_call(self, call: CallRecord) -> None: ...  # one finished forward call, in call order


def check_causal_lm(model: Any, role: str) -> None:
    """Refuse anything whose output is not next-token logits: the argmax would mean nothing."""
    if not isinstance(model, torch.nn.Module):
        raise WatchError(f"{role} is a {type(model).__name__}, not a torch module; pass the model itself")
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise WatchError(f"{role} ({type(model).__name__}) is an encoder-decoder model, not a causal LM")
    if getattr(model, "get_output_embeddings", lambda: None)() is None:
        raise WatchError(
            f"{role} ({type(model).__name__}) is not a causal LM: it has no LM head "
            "(pass the *ForCausalLM model, not its base model)"
        )


def cache_width(cache: Any) -> int:
    """Slots in the cache before the call (0 without one); HF derives `cache_position` from it."""
    if hasattr(cache, "get_seq_length"):
        try:
            return int(cache.get_seq_length())
        except (TypeError, ValueError, AttributeError, NotImplementedError):
            return 0  # a cache that does not count (transformers' paged cache): the keys are read from the mask
    if isinstance(cache, (tuple, list)) and cache and cache[0] is not None:  # legacy tuple-of-tuples
        return int(cache[0][0].shape[-2])
    return 0


class CacheSerials:
    """A serial per cache object fed, never reused while the watch runs (an `id` is, once the object is
    freed): which calls continue one cache. None for no cache, or one no weak reference can hold."""

    def __init__(self) -> None:
        self._of: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._next = itertools.count()

    def __call__(self, cache: Any) -> int | None:
        try:
            if cache not in self._of:
                self._of[cache] = next(self._next)
            return self._of[cache]
        except TypeError:  # None, a tuple (legacy caches, new each call) or an unhashable object
            return None


class _NoTap:
    """The tap of a model watched without a named head: never open, keeps and matches nothing."""

    open = False

    def start(self, query_len: int) -> None: ...
    def match_rows(self, fed: dict[str, Any], args: tuple[Any, ...]) -> None: ...
    def end(self) -> list[CallRecord]:
        return []


NO_TAP = _NoTap()  # stateless: one for every model watched without a head


class ModelHooks:
    """Pre- and post-forward hooks on one model, appending a CallRecord per call to `sink`."""

    def __init__(self, model: Any, role: str, sink: CallSink, drafter: bool = False, tap: Any = NO_TAP) -> None:
        # `tap`, a `headinput.HiddenTap` (or `TapSet`): a target's calls feed it, a head's are matched with it.
        self.model, self.role, self.sink, self.tap = model, role, sink, tap
        self.fed_tap, self._read = (NO_TAP, self._head_call) if drafter else (tap, self._target_call)
        self.model_type = getattr(getattr(model, "config", None), "model_type", "")
        self.param_names = list(inspect.signature(model.forward).parameters)  # bound: no `self`
        self.open: list[CallRecord | None] = []
        self._unit = torch.empty(0)  # the embedding table, rows normalized (inputs_embeds)
        self._cache_serial = CacheSerials()
        self._key_copies = None if role == "draft" else KeyCopies()  # (the command names roles at the end)
        self.handles = [
            model.register_forward_pre_hook(self.before, with_kwargs=True),
            model.register_forward_hook(self.after, with_kwargs=True),
        ]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    # No `torch.no_grad()` (a context switch per call): nothing copied here is differentiable.
    def before(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.open.append(self._read(args, {**dict(zip(self.param_names, args)), **kwargs}))

    def _target_call(self, args: tuple[Any, ...], fed: dict[str, Any]) -> CallRecord | None:
        input_ids = fed.get("input_ids")
        if input_ids is None:
            input_ids = self._ids_of_embeddings(fed.get("inputs_embeds"))
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            return None  # odd shapes: nothing to attribute
        self.fed_tap.start(input_ids.shape[1])  # recorded calls only: the tap's ages count them
        started = time.perf_counter()
        cache = fed.get("cache", fed.get("past_key_values"))
        width = cache_width(cache)
        batch, q = input_ids.shape
        mask, said = fed.get("attention_mask"), self.sink.declared(self.role)
        packed = batch == 1 and q > 1  # one row that may hold several sequences: mask and argmax kept whole
        kind, kept, live = mask_copy(mask, None if packed else QUERY_TAIL)
        if kind == "4d" and mask.shape[-1] != width + q:  # keys not [cache | query]: a static cache's
            kind = "4d-slots"
        elif kind == "2d":  # over the call's own keys: past them, a static cache's slots are unwritten
            kept = kept[:, : width + q]  # and the model's causal rule hides them
        elif live is not None and kept.shape[1] == q:  # `live`: a 4-D mask's tail (`mask_copy`)
            # A real query token attends its own key; a slot that does not is a finished row's pad. So
            # is one that attends nothing but its own key, which no other slot attends, in a row that
            # reads its cache (a pad kept from an all-masked softmax; a one-token newcomer reads none).
            cols = torch.arange(q, device=kept.device)
            alone = (kept.sum(-1) == 1) & (kept[:, :, width:].sum(1) == 1) & kept[:, :, :width].any(-1).any(-1, True)
            live = live & (kept[:, cols, width + cols] & ~alone).to(live.device)
        positions, positions_fed = self._positions(fed, mask, kind, batch, width, q)
        record = CallRecord(
            self.role, said.rows, input_ids.clone(), positions, positions_fed, width, kind, kept, batch, q
        )
        record.query_live, record.started, record.packed = live, started, packed
        record.cache_id = self._cache_serial(cache)
        # Where a row's mask names its key slots (not a static cache's; a packed row's: if it is one sequence).
        if self._key_copies is not None and kind in ("2d", "4d", "none"):
            record.keys0 = self._key_copies(cache, width, batch)
        record.cu_q, record.cu_k = _copy(fed.get("cu_seq_lens_q")), _copy(fed.get("cu_seq_lens_k"))
        record.query_lens, record.parents, record.declared = said.query_lens, said.parents, said.facts
        record.logit_slots = _copy(fed.get("logits_to_keep"))  # a tensor of columns; an int keeps the last
        return record

    def _ids_of_embeddings(self, embeds: Any) -> torch.Tensor | None:
        """The ids whose embedding rows these are (-1: not a token's; docs/watch-heads.md)."""
        table = getattr(self.model, "get_input_embeddings", lambda: None)()
        weight = getattr(table, "weight", None)
        if not isinstance(embeds, torch.Tensor) or not isinstance(weight, torch.Tensor):
            return None
        if embeds.shape[-1] != weight.shape[-1]:  # not vectors of this table's width
            return None
        if self._unit.shape != weight.shape:
            self._unit = torch.nn.functional.normalize(weight.detach().float(), dim=-1)
        vectors = embeds.detach().float()  # [B, T, H]; another shape reads as no ids (`_target_call`)
        ids = (torch.nn.functional.normalize(vectors, dim=-1) @ self._unit.T).argmax(-1)
        same = torch.isclose(table(ids).float(), vectors, rtol=1e-3, atol=1e-5).all(-1)
        return torch.where(same, ids, torch.full_like(ids, -1))

    def _head_call(self, args: tuple[Any, ...], fed: dict[str, Any]) -> CallRecord | None:
        """A draft head's call (fed hidden states, not ids): its time and proposals (`headinput`)."""
        first = next((v for v in (*args, *fed.values()) if isinstance(v, torch.Tensor) and v.dim() >= 2), None)
        if first is None:
            return None
        batch, q = first.shape[0], first.shape[1] if first.dim() >= 3 else 1
        empty = [[0] * q for _ in range(batch)]  # no ids or positions: hidden states
        record = CallRecord(
            "draft", None, empty, empty, False, 0, "unknown", None, batch, q, started=time.perf_counter()
        )
        record.drafter, record.head_fed, record.nested = True, self.tap.match_rows(fed, args), self.tap.open
        return record

    def after(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        nested = self.fed_tap.end()  # head calls made inside this call: matched now, recorded after it
        record = self.open.pop()  # `before` pushed one (None: not recorded) for every call
        if record is not None:
            self._finish(record, output)
        for held in nested:
            self.sink.add_call(held)

    def _finish(self, record: CallRecord, output: Any) -> None:
        """Keep the argmax of the last query slots, `logits_to_keep`'s or a long packed row's columns."""
        logits = logits_of(output)
        if not (isinstance(logits, torch.Tensor) and logits.dim() == 3):  # no argmax: no columns of it either
            record.logit_slots = None
        elif record.logit_slots is not None and logits.shape[1] == len(record.logit_slots):
            record.argmax = argmax_of(logits)  # logits_to_keep's columns (else the model ignored them)
        elif record.packed and logits.shape[1] > QUERY_TAIL:  # a long packed row (prefills)
            record.logit_slots = _segment_tails(record, logits.shape[1])
            record.argmax = argmax_of(logits[:, record.logit_slots])
        else:
            record.argmax, record.logit_slots = argmax_of(logits[:, -QUERY_TAIL:]), None
        record.ended = time.perf_counter()
        if record.nested:  # only a head's, while the target's call is open
            self.tap.hold(record)
        else:
            self.sink.add_call(record)

    def _positions(self, fed: dict[str, Any], mask: Any, kind: str, batch: int, width: int, q: int) -> tuple[Any, bool]:
        """The call's positions, and whether they were fed (else the model's own rule)."""
        for name, was_fed in (("position_ids", True), ("cache_position", False)):
            value = fed.get(name)
            if isinstance(value, torch.Tensor):  # [batch, q], or one row of it broadcast
                return value.reshape(-1, q).expand(batch, q).clone(), was_fed
        if self.model_type == "opt" and kind == "2d":
            # OPT's learned positions count the mask's ones (its own rule, padding-aware).
            ones = mask.long()
            return ((ones.cumsum(1) * ones) - 1)[:, -q:].clone(), False
        return [list(range(width, width + q)) for _ in range(batch)], False  # no tensor op needed


def logits_of(output: Any) -> Any:
    """What a forward returned as logits: the first of a tuple (return_dict=False), else `.logits`, else
    itself (a bare head returns its logits)."""
    if isinstance(output, (tuple, list)):
        output = next(iter(output), None)
    return getattr(output, "logits", output)


def _segment_tails(record: CallRecord, width: int) -> torch.Tensor:
    """The columns of a long packed row whose argmax is kept: the last SEGMENT_TAIL before each place
    a sequence may end (`cu_seq_lens_q`, else a mask line that drops a slot the line before attends:
    a superset of `batchmap`'s cut) and the row's end."""
    if record.cu_q is not None:
        ends = record.cu_q[1:].long()
    elif record.mask is not None and record.mask.shape[-2] == width:  # a 4-D mask: a line per column
        starts = torch.nonzero(through_host(record.mask[0], lambda m: (m[:-1] & ~m[1:]).any(-1))).flatten() + 1
        ends = torch.cat([starts, torch.tensor([width], device=starts.device)])
    else:
        return torch.arange(width)
    columns = (ends[:, None] + torch.arange(-SEGMENT_TAIL, 0, device=ends.device)[None, :]).flatten()
    return torch.unique(columns[(columns >= 0) & (columns < width)])


def _copy(value: Any) -> torch.Tensor | None:
    """A copy of a tensor argument (the engine may reuse its buffer); None for anything else; of a
    dict by layer type (transformers' paged `cu_seq_lens_k`), its full attention's."""
    if isinstance(value, dict):
        value = value.get("full_attention", next(iter(value.values()), None))
    return value.clone() if isinstance(value, torch.Tensor) else None
