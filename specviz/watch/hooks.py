"""Forward hooks: what one model call was actually fed, captured without touching the engine.

Per call we keep, as small device tensors (no host sync on the hot path): the input ids; the
position ids, fed or, when the engine passes none, the ones the model derives itself (for most HF
models `cache_position`, the physical slot index, which ignores left padding: a bug many engines
ship); the attention mask as "may attend" booleans (a 2-D mask as fed, a 4-D mask's last query
rows); the physical cache width before the call (`cache` or the older `past_key_values`); the
argmax of the logits of the last query slots (up to QUERY_TAIL, for both roles: a right-padded
row's last real token is not in the last column).
A forward costs the watch one tensor op per fed tensor and one argmax (~5-10 us each on a small
model, a share of a decode step worth counting), and close one `tolist` per kept tensor. The rest
(which query slots are real, how many slots each attends) is read from the lists, in Python, at
close (`CallRecord.materialize`), the only place the watch syncs with the host. Tensors on the CPU
are read through numpy where cheaper (`on_host`: the argmax, a large mask's compare, a packed
mask's counts): a view, several times faster than torch's single-threaded CPU reductions.
"""

from __future__ import annotations

import inspect
import time
from typing import Any, NamedTuple, Protocol

import numpy
import torch

from specviz.errors import SpecvizError
from specviz.watch.record import CallRecord
from specviz.watch.tensor_reads import QUERY_TAIL, argmax_of, mask_copy, on_host

CACHE_KEYWORDS = ("cache", "past_key_values")


class WatchError(SpecvizError):
    """Bad use of `specviz.watch`: the message says what to change."""


class Declared(NamedTuple):
    """What was said of one forward of a model before it ran: the sequence each row (or packed
    segment) holds (None: undeclared), and with `w.batch` their query lengths, trees and
    (drafts, chunk) facts."""

    rows: tuple[int, ...] | None = None
    query_lens: list[int] | None = None
    parents: list[list[int]] | None = None
    facts: tuple[tuple[int | None, bool], ...] | None = None


class CallSink(Protocol):
    """Where `ModelHooks` sends what it captures (the `Watch`, or `AutoWatch` for the CLI)."""

    def declared(self, role: str = "target") -> Declared:
        """What was said of the forward of `role`'s model starting now; taking it ends a
        declaration made for that one forward (`w.batch`), so each is read by one forward."""
        ...

    def add_call(self, call: CallRecord) -> None:
        """One finished forward call, in call order."""
        ...


def check_causal_lm(model: Any, role: str) -> None:
    """Refuse anything whose output is not next-token logits: the argmax would mean nothing."""
    if not isinstance(model, torch.nn.Module):
        raise WatchError(f"{role} is a {type(model).__name__}, not a torch module; pass the model itself")
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
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


class _NoTap:
    """The tap of a model watched without a named head: never open, it keeps, holds and matches nothing."""

    open = False

    def start(self, query_len: int) -> None: ...
    def end(self) -> None: ...
    def match_rows(self, fed: dict[str, Any], args: tuple[Any, ...]) -> None: ...
    def release(self) -> list[CallRecord]:
        return []


class ModelHooks:
    """Pre- and post-forward hooks on one model, appending a CallRecord per call to `sink`."""

    def __init__(self, model: Any, role: str, sink: CallSink, drafter: bool = False, tap: Any = None) -> None:
        self.model = model
        self.role = role
        self.drafter = drafter
        # `headinput.HiddenTap`, given to the target's hooks and the head's (the command's head: a
        # `TapSet`): the target's calls feed it (`fed_tap`), the head's are matched with it (`tap`).
        self.tap = _NoTap() if tap is None else tap
        self.fed_tap = _NoTap() if drafter else self.tap
        self.sink = sink
        self.model_type = getattr(getattr(model, "config", None), "model_type", "")
        self.param_names = [p for p in inspect.signature(model.forward).parameters if p != "self"]
        self.open: list[CallRecord | None] = []
        self._unit = torch.empty(0)  # the embedding table, rows normalized (inputs_embeds)
        self.handles = [
            model.register_forward_pre_hook(self.before, with_kwargs=True),
            model.register_forward_hook(self.after, with_kwargs=True),
        ]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    # No `torch.no_grad()` wrapper (a context switch per call): nothing here is differentiable,
    # the copies are of integer and boolean tensors and the argmax of the logits is an index.
    def before(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        fed = {**dict(zip(self.param_names, args)), **kwargs}
        input_ids = fed.get("input_ids")
        if self.drafter:
            self.open.append(self._head_call(args, fed))
            return
        if input_ids is None and isinstance(fed.get("inputs_embeds"), torch.Tensor):
            input_ids = self._ids_of_embeddings(fed["inputs_embeds"])
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            self.open.append(None)  # odd shapes: nothing to attribute
            return
        self.fed_tap.start(input_ids.shape[1])  # recorded calls only: the tap's ages count them
        started = time.perf_counter()
        cache = next((fed[k] for k in CACHE_KEYWORDS if fed.get(k) is not None), None)
        width = cache_width(cache)
        batch, q = input_ids.shape
        mask = fed.get("attention_mask")
        said = self.sink.declared(self.role)
        # One row that may hold several sequences: its mask and argmax are kept whole (`batchmap`).
        packed = batch == 1 and q > 1
        kind, kept, live = mask_copy(mask, None if packed else QUERY_TAIL)
        if kind == "4d" and mask.shape[-1] != width + q:
            # Keys are not [cache | query]: a static or in-place cache writes the query's keys at
            # slots inside the keys that the mask alone does not name, so only what each query
            # slot attends is read, not where (`calls.mask_row`).
            kind = "4d-slots"
        elif live is not None and kept.shape[1] == q:  # `live`: a 4-D mask's tail (`mask_copy`)
            # A real query token attends its own key (the query block's diagonal of a [cache |
            # query] mask); a slot that does not feeds nothing, though it may see the cache (a
            # finished row fed a pad with its query masked out, kept in the batch).
            cols = torch.arange(q, device=kept.device)
            live = live & kept[:, cols, width + cols].to(live.device)
        positions, positions_fed = self._positions(fed, mask, kind, batch, width, q)
        keep = fed.get("logits_to_keep")
        self.open.append(
            CallRecord(
                role=self.role,
                rows=said.rows,
                input_ids=input_ids.clone(),
                positions=positions,
                positions_fed=positions_fed,
                cache_width=width,
                mask_kind=kind,
                mask=kept,
                query_live=live,
                batch_size=batch,
                query_len=q,
                started=started,
                packed=packed,
                cu_q=_copy(fed.get("cu_seq_lens_q")),
                cu_k=_copy(_one_tensor(fed.get("cu_seq_lens_k"))),
                query_lens=said.query_lens,
                parents=said.parents,
                declared=said.facts,
                logit_slots=keep.clone() if isinstance(keep, torch.Tensor) and keep.dim() == 1 else None,
            )
        )

    def _ids_of_embeddings(self, embeds: torch.Tensor) -> torch.Tensor | None:
        """The token ids whose embedding rows these are ([B, T, H] -> [B, T]): the nearest row of the
        model's embedding table by direction, kept only where the model's own embedding of it equals
        the vector fed (-1 elsewhere: an image feature, a soft prompt, anything not a token)."""
        table = getattr(self.model, "get_input_embeddings", lambda: None)()
        weight = getattr(table, "weight", None)
        if not isinstance(weight, torch.Tensor) or embeds.dim() != 3 or embeds.shape[-1] != weight.shape[-1]:
            return None
        if self._unit.shape != weight.shape:
            self._unit = torch.nn.functional.normalize(weight.detach().float(), dim=-1)
        vectors = embeds.detach().float()
        ids = (torch.nn.functional.normalize(vectors, dim=-1) @ self._unit.T).argmax(-1)
        same = torch.isclose(table(ids).float(), vectors, rtol=1e-3, atol=1e-5).all(-1)
        return torch.where(same, ids, torch.full_like(ids, -1))

    def _head_call(self, args: tuple[Any, ...], fed: dict[str, Any]) -> CallRecord | None:
        """A draft head's call (EAGLE, MTP, Medusa: fed hidden states or embeddings, not ids): kept
        as a draft call for its time and proposals; which row it served is read from the verify."""
        first = next((v for v in (*args, *fed.values()) if isinstance(v, torch.Tensor) and v.dim() >= 2), None)
        if first is None:
            return None
        batch, q = first.shape[0], first.shape[1] if first.dim() >= 3 else 1
        empty = [[0] * q for _ in range(batch)]
        return CallRecord(
            role="draft",
            rows=None,
            input_ids=empty,
            positions=empty,
            positions_fed=False,
            cache_width=0,
            mask_kind="unknown",
            mask=None,
            batch_size=batch,
            query_len=q,
            started=time.perf_counter(),
            drafter=True,
            head_fed=self.tap.match_rows(fed, args),
            nested=self.tap.open,
        )

    def after(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        self.fed_tap.end()
        record = self.open.pop() if self.open else None
        if record is not None:
            self._finish(record, output)
        for held in self.fed_tap.release():  # head calls made inside this call come after it
            self.sink.add_call(held)

    def _finish(self, record: CallRecord, output: Any) -> None:
        logits = getattr(output, "logits", output)  # a bare head returns its logits
        if logits is output and isinstance(output, (tuple, list)) and output:
            logits = output[0]
        if isinstance(logits, torch.Tensor) and logits.dim() == 3:
            if record.logit_slots is not None and logits.shape[1] != len(record.logit_slots):
                record.logit_slots = None  # the model ignored logits_to_keep: every column's logits
            if record.logit_slots is not None or logits.shape[1] <= QUERY_TAIL:
                record.argmax = argmax_of(logits)
            elif record.packed:  # a long packed row (prefills): the last slots of each sequence in it
                columns = _segment_tails(record, logits.shape[1])
                record.argmax, record.logit_slots = argmax_of(logits[:, columns]), columns
            else:
                record.argmax = argmax_of(logits[:, -QUERY_TAIL:])
        record.ended = time.perf_counter()
        if record.nested:  # only a head's, while the target's call is open
            self.tap.hold(record)
        else:
            self.sink.add_call(record)

    def _positions(self, fed: dict[str, Any], mask: Any, kind: str, batch: int, width: int, q: int) -> tuple[Any, bool]:
        position_ids = fed.get("position_ids")
        if isinstance(position_ids, torch.Tensor):
            if position_ids.shape == (batch, q):
                return position_ids.clone(), True  # one op, the usual case
            return position_ids.reshape(-1, q).expand(batch, q).clone(), True
        cache_position = fed.get("cache_position")
        if isinstance(cache_position, torch.Tensor):
            return cache_position.reshape(1, q).expand(batch, q).clone(), False
        if self.model_type == "opt" and kind == "2d":
            # OPT's learned positions count the mask's ones (its own rule, padding-aware).
            ones = mask.long()
            return ((ones.cumsum(1) * ones) - 1)[:, -q:].clone(), False
        return [list(range(width, width + q)) for _ in range(batch)], False  # no tensor op needed


SEGMENT_TAIL = 16  # a long packed row keeps the argmax of each sequence's last slots (drafts, pending)


def _segment_tails(record: CallRecord, width: int) -> torch.Tensor:
    """The query columns of a long packed row whose argmax is kept: the last SEGMENT_TAIL before
    every place a sequence may end (`cu_seq_lens_q`, else every token whose mask drops a slot the
    token before attended: a superset of the cut `batchmap` makes), and the row's end."""
    if isinstance(record.cu_q, torch.Tensor):
        ends = record.cu_q[1:].long()
    elif isinstance(record.mask, torch.Tensor) and record.mask.dim() == 3 and record.mask.shape[1] == width:
        seen, host = record.mask[0], on_host(record.mask[0])
        if host is not None:  # numpy on the CPU (`on_host`)
            starts = torch.from_numpy(numpy.flatnonzero((host[:-1] & ~host[1:]).any(-1)) + 1)
        else:
            starts = torch.nonzero((seen[:-1] & ~seen[1:]).any(-1)).flatten() + 1
        ends = torch.cat([starts, torch.tensor([width], device=starts.device)])
    else:
        return torch.arange(width)
    offsets = torch.arange(-SEGMENT_TAIL, 0, device=ends.device)
    columns = (ends.to(offsets.device)[:, None] + offsets[None, :]).flatten()
    return torch.unique(columns[(columns >= 0) & (columns < width)])


def _copy(value: Any) -> torch.Tensor | None:
    """A copy of a tensor argument (the engine may reuse its buffer); None for anything else."""
    return value.clone() if isinstance(value, torch.Tensor) else None


def _one_tensor(value: Any) -> Any:
    """`cu_seq_lens_k` is a tensor, or (transformers' paged attention) a dict by layer type: the
    full-attention one."""
    if isinstance(value, dict):
        return value.get("full_attention", next(iter(value.values()), None))
    return value
