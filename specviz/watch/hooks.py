"""Forward hooks: what one model call was actually fed, captured without touching the engine.

Per call we keep, as small device tensors (no host sync on the hot path):
- the input ids and the position ids, either fed or, when the engine passes none, the ones the
  model derives itself (for most HF models: `cache_position`, i.e. the physical slot index, which
  ignores left padding: exactly the bug many engines ship);
- the attention mask: a 2-D mask as fed; a 4-D mask as a per-row boolean view of its last query rows;
- the physical cache width before the call (`cache` or the older `past_key_values` keyword);
- how many earlier slots the last query token attends (the draft's context width);
- the argmax of the output logits of the last query slots (up to QUERY_TAIL), for both roles: a
  right-padded row's last real token is not in the last column.
Everything is turned into plain lists only when the watch closes (`CallRecord.materialize`).
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
    mask_kind: str  # "2d" | "4d" | "none" (everything attended) | "unknown"
    mask: Any  # 2d: [B, W] bool; 4d: [B, tail, W] bool (last query rows); else None
    context_last: Any  # [B]: earlier slots the last query token attends
    argmax: Any = None  # [B, L]: argmax of the logits of the last L query slots
    started: float = 0.0
    ended: float = 0.0

    @property
    def batch_size(self) -> int:
        return len(self.input_ids)

    @property
    def query_len(self) -> int:
        return len(self.input_ids[0]) if len(self.input_ids) else 0

    def materialize(self) -> None:
        """Tensors to lists, once, at close: the only host syncs the watch adds."""
        for name in ("input_ids", "positions", "mask", "context_last", "argmax"):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.tolist())


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


def _attended(mask: torch.Tensor) -> torch.Tensor:
    """Boolean 'may attend' from a bool, 0/1 or additive float mask."""
    if mask.dtype == torch.bool:
        return mask
    if mask.is_floating_point():
        return mask == 0  # additive: 0 attends, a large negative number blocks
    return mask != 0


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

    @torch.no_grad()
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
        kind, kept, context = self._mask(mask, batch, width, q)
        positions, positions_fed = self._positions(fed, mask if kind == "2d" else None, batch, width, q)
        self.open.append(
            CallRecord(
                role=self.role,
                rows=self.sink.current_rows(self.role),
                input_ids=input_ids.detach().clone(),
                positions=positions,
                positions_fed=positions_fed,
                cache_width=width,
                mask_kind=kind,
                mask=kept,
                context_last=context,
                started=started,
            )
        )

    @torch.no_grad()
    def after(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        record = self.open.pop() if self.open else None
        if record is None:
            return
        logits = getattr(output, "logits", None)
        if logits is None and isinstance(output, (tuple, list)) and output:
            logits = output[0]
        if isinstance(logits, torch.Tensor) and logits.dim() == 3:
            record.argmax = logits[:, -QUERY_TAIL:].argmax(-1)
        record.ended = time.perf_counter()
        self.sink.add_call(record)

    def _positions(
        self, fed: dict[str, Any], mask2d: torch.Tensor | None, batch: int, width: int, q: int
    ) -> tuple[torch.Tensor, bool]:
        position_ids = fed.get("position_ids")
        if isinstance(position_ids, torch.Tensor):
            return position_ids.detach().reshape(-1, q).expand(batch, q).clone(), True
        cache_position = fed.get("cache_position")
        if isinstance(cache_position, torch.Tensor):
            return cache_position.detach().reshape(1, q).expand(batch, q).clone(), False
        if self.model_type == "opt" and mask2d is not None:
            # OPT's learned positions count the mask's ones (its own rule, padding-aware).
            ones = mask2d.long()
            return ((ones.cumsum(1) * ones) - 1)[:, -q:].clone(), False
        device = fed["input_ids"].device
        return torch.arange(width, width + q, device=device).expand(batch, q).clone(), False

    def _mask(self, mask: Any, batch: int, width: int, q: int) -> tuple[str, Any, torch.Tensor]:
        device = self.sink_device(mask)
        if mask is None:
            return "none", None, torch.full((batch,), width + q - 1, device=device)
        if not isinstance(mask, torch.Tensor):
            return "unknown", None, torch.full((batch,), -1, device=device)
        if mask.dim() == 2:
            seen = _attended(mask.detach())
            return "2d", seen.clone(), seen[:, : max(seen.shape[1] - 1, 0)].sum(1)
        if mask.dim() == 4:
            seen = _attended(mask.detach()[:, 0])  # heads share the mask
            last = width + q - 1  # the last query token's own slot
            context = seen[:, -1, :last].sum(1)
            return "4d", seen[:, -QUERY_TAIL:].clone(), context
        return "unknown", None, torch.full((batch,), -1, device=device)

    @staticmethod
    def sink_device(mask: Any) -> torch.device | None:
        return mask.device if isinstance(mask, torch.Tensor) else None
