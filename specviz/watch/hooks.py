"""Forward hooks: what one model call was actually fed, captured without touching the engine.

Per call we keep, as small device tensors (no host sync on the hot path):
- the input ids and the position ids, either fed or, when the engine passes none, the ones the
  model derives itself (for most HF models: `cache_position`, i.e. the physical slot index, which
  ignores left padding: exactly the bug many engines ship);
- the attention mask as "may attend" booleans: a 2-D mask as fed, a 4-D mask's last query rows;
- the physical cache width before the call (`cache` or the older `past_key_values` keyword);
- the argmax of the output logits of the last query slots (up to QUERY_TAIL), for both roles: a
  right-padded row's last real token is not in the last column.
A forward costs the watch one tensor op per fed tensor and one argmax, nothing more: on a small
model every op is ~5-10 us, a share of a decode step worth counting, and the same holds at close
(one `tolist` per kept tensor). Everything else (which query slots are real, how many earlier
slots a query token attends) is read from the lists, in Python, when the watch closes
(`CallRecord.materialize`), which is also where the only host syncs the watch adds happen.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from specviz.errors import SpecvizError

# 4-D masks keep only their last query rows: a verify window is never longer, and a prefill's
# [q, W] block would otherwise cost q x W per row.
QUERY_TAIL = 128
CACHE_KEYWORDS = ("cache", "past_key_values")


class WatchError(SpecvizError):
    """Bad use of `specviz.watch`: the message says what to change."""


@dataclass
class CallRecord:
    """One forward call of one watched model; tensors until `materialize`, lists after."""

    role: str  # "target" | "draft"
    rows: tuple[int, ...] | None  # sequence held by each row at call time (None: the default order)
    input_ids: Any  # [B, q]
    positions: Any  # [B, q] fed, or derived by the model's own rule
    positions_fed: bool
    cache_width: int
    # "2d" | "4d" (keys: cache then query) | "4d-slots" (keys: a static or in-place cache's slots)
    # | "none" (everything attended) | "unknown"
    mask_kind: str
    mask: Any  # may attend: 2d [B, W]; 4d [B, tail, W] (the last query rows); else None
    batch_size: int  # B
    query_len: int  # q
    argmax: Any = None  # [B, L]: argmax of the logits of the last L query slots
    # 4-D masks: [B, q], whether each query slot attends anything. A padded query slot attends
    # nothing (its row is all masked), so this is where a 4-D mask says which slots are padding.
    query_live: Any = None
    # False when the engine's token is not the argmax of these logits (declared to the watch: it
    # samples, or applies logits processors first): the argmax then never matches or judges a token.
    argmax_is_choice: bool = True
    started: float = 0.0
    ended: float = 0.0
    last_slots: list[int] | None = None  # [B]: each row's last attended query slot, set by `materialize`

    def materialize(self) -> None:
        """Tensors to lists, once, at close: the only host syncs the watch adds."""
        if self.last_slots is not None:
            return
        for name in ("input_ids", "positions", "mask", "argmax", "query_live"):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.tolist())
        self.last_slots = [self._last_slot(row) for row in range(self.batch_size)]

    def query_flags(self, row: int) -> list[int]:
        """1 for each query slot of `row` that is attended (a real token), 0 for padding."""
        q = self.query_len
        if self.mask_kind == "2d":
            values = self.mask[row]
            if len(values) >= q:
                return [int(v) for v in values[len(values) - q :]]
        if self.query_live is not None and any(self.query_live[row]):
            return [int(v) for v in self.query_live[row]]
        return [1] * q

    def _last_slot(self, row: int) -> int:
        """The row's last attended query slot (the last one when none is), read off the mask row."""
        q = self.query_len
        if self.mask_kind == "2d":
            values = self.mask[row]
            start = len(values) - q
            if start >= 0:
                return next((j for j in range(q - 1, -1, -1) if values[start + j]), q - 1)
        if self.query_live is not None:
            return next((j for j in range(q - 1, -1, -1) if self.query_live[row][j]), q - 1)
        return q - 1


class CallSink(Protocol):
    """Where `ModelHooks` sends what it captures (the `Watch`, or `AutoWatch` for the CLI)."""

    def current_rows(self, role: str = "target") -> tuple[int, ...] | None:
        """The sequence each batch row of `role`'s model holds now (None: undeclared)."""
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
    get_head = getattr(model, "get_output_embeddings", None)
    if get_head is None or get_head() is None:
        raise WatchError(
            f"{role} ({type(model).__name__}) is not a causal LM: it has no LM head "
            "(pass the *ForCausalLM model, not its base model)"
        )


def cache_width(cache: Any) -> int:
    """Slots in the cache before the call; HF derives `cache_position` from the same number."""
    if cache is None:
        return 0
    if hasattr(cache, "get_seq_length"):
        return int(cache.get_seq_length())
    if isinstance(cache, (tuple, list)) and cache and cache[0] is not None:  # legacy tuple-of-tuples
        return int(cache[0][0].shape[-2])
    return 0


class ModelHooks:
    """Pre- and post-forward hooks on one model, appending a CallRecord per call to `sink`."""

    def __init__(self, model: Any, role: str, sink: CallSink) -> None:
        self.model = model
        self.role = role
        self.sink = sink
        self.model_type = getattr(getattr(model, "config", None), "model_type", "")
        self.param_names = [p for p in inspect.signature(model.forward).parameters if p != "self"]
        self.open: list[CallRecord] = []
        self.handles = [
            model.register_forward_pre_hook(self.before, with_kwargs=True),
            model.register_forward_hook(self.after, with_kwargs=True),
        ]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if not args:
            return kwargs
        return {**dict(zip(self.param_names, args)), **kwargs}

    # No `torch.no_grad()` wrapper (a context switch per call): nothing here is differentiable,
    # the copies are of integer and boolean tensors and the argmax of the logits is an index.
    def before(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        fed = self._arguments(args, kwargs)
        input_ids = fed.get("input_ids")
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            self.open.append(None)  # inputs_embeds or odd shapes: nothing to attribute
            return
        started = time.perf_counter()
        cache = next((fed[k] for k in CACHE_KEYWORDS if fed.get(k) is not None), None)
        width = cache_width(cache)
        batch, q = input_ids.shape
        mask = fed.get("attention_mask")
        kind, kept, live = _mask_copy(mask)
        if kind == "4d" and mask.shape[-1] != width + q:
            # Keys are not [cache | query]: a static or in-place cache writes the query's keys at
            # slots inside the keys that the mask alone does not name, so only what each query
            # slot attends is read, not where (`calls.mask_row`).
            kind = "4d-slots"
        positions, positions_fed = self._positions(fed, mask if kind == "2d" else None, batch, width, q)
        self.open.append(
            CallRecord(
                role=self.role,
                rows=self.sink.current_rows(self.role),
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
            )
        )

    def after(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        record = self.open.pop() if self.open else None
        if record is None:
            return
        logits = getattr(output, "logits", None)
        if logits is None and isinstance(output, (tuple, list)) and output:
            logits = output[0]
        if isinstance(logits, torch.Tensor) and logits.dim() == 3:
            tail = logits if logits.shape[1] <= QUERY_TAIL else logits[:, -QUERY_TAIL:]
            record.argmax = tail.argmax(-1)
        record.ended = time.perf_counter()
        self.sink.add_call(record)

    def _positions(
        self, fed: dict[str, Any], mask2d: torch.Tensor | None, batch: int, width: int, q: int
    ) -> tuple[Any, bool]:
        position_ids = fed.get("position_ids")
        if isinstance(position_ids, torch.Tensor):
            if position_ids.shape == (batch, q):
                return position_ids.clone(), True  # one op, the usual case
            return position_ids.reshape(-1, q).expand(batch, q).clone(), True
        cache_position = fed.get("cache_position")
        if isinstance(cache_position, torch.Tensor):
            return cache_position.reshape(1, q).expand(batch, q).clone(), False
        if self.model_type == "opt" and mask2d is not None:
            # OPT's learned positions count the mask's ones (its own rule, padding-aware).
            ones = mask2d.long()
            return ((ones.cumsum(1) * ones) - 1)[:, -q:].clone(), False
        return [list(range(width, width + q)) for _ in range(batch)], False  # no tensor op needed


def _mask_copy(mask: Any) -> tuple[str, torch.Tensor | None, torch.Tensor | None]:
    """The mask's kind, its "may attend" booleans (a copy, never a view of the engine's; a 4-D
    mask: head 0's last query rows, heads share the mask) and, for a 4-D mask, whether each query
    slot attends anything ([B, q]). One pass over the mask for each."""
    if mask is None:
        return "none", None, None
    if not isinstance(mask, torch.Tensor):
        return "unknown", None, None
    if mask.dim() == 2:
        seen = _attended(mask)
        return "2d", seen.clone() if seen is mask else seen, None
    if mask.dim() == 4:
        seen = _attended(mask[:, 0])
        return "4d", seen[:, -QUERY_TAIL:].clone(), seen.any(-1)
    return "unknown", None, None


def _attended(mask: torch.Tensor) -> torch.Tensor:
    """Boolean 'may attend' from a bool (returned as is), 0/1 or additive float mask."""
    if mask.dtype == torch.bool:
        return mask
    if mask.is_floating_point():
        return mask == 0  # additive: 0 attends, a large negative number blocks
    return mask != 0
