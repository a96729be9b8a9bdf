"""What vLLM's model runner declares each step, copied out as plain records (runs inside vLLM).

`install()` wraps five methods of vLLM's `GPUModelRunner` (which `CPUModelRunner` extends) and its
proposer's `propose`; each wrapper calls the original and copies what it built or was fed (docs/vllm.md
section 3). A step (an `execute_model` that schedules tokens) becomes one JSON line appended to
`<dir>/engine-<pid>.jsonl` as it ends, so the process that reads them may be another one."""

from __future__ import annotations

import json
import os
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

# A record line's format, 2: sampled rows without -1s, spec, engine and min_tokens always (others refused).
FORMAT = 2
# A request without sampling parameters (a pooling request): no budget, no stop token, greedy.
_NO_PARAMS = SimpleNamespace(max_tokens=None, min_tokens=0, all_stop_token_ids=(), temperature=0.0)
_NO_SPEC = SimpleNamespace(method=None)  # no speculation
SPEC = ("draft_token_ids", "num_draft_tokens", "target_logits_indices", "bonus_logits_indices")


class StepTap:
    """One runner process's records: its file, steps counted, the step being built, the step sampling."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.count = path, 0
        self.step: dict[str, Any] | None = None
        self.drafting: dict[str, Any] | None = None

    def begin(self, runner: Any, scheduler_output: Any) -> None:
        """A step that schedules tokens starts (dummy and profile runs never enter execute_model)."""
        if scheduler_output.total_num_scheduled_tokens:
            spec = runner.speculative_config or _NO_SPEC
            import vllm

            self.step = {
                "format": FORMAT,
                "step": self.count,
                "engine": {
                    "vllm": vllm.__version__,
                    "model": str(runner.model_config.model),
                    "method": spec.method,
                    # the draft model config of other methods is a head's or the target's
                    "draft_model": str(spec.draft_model_config.model) if spec.method == "draft_model" else None,
                },
                "new": [_new_request(r) for r in scheduler_output.scheduled_new_reqs],
                "block_size": int(runner.cache_config.block_size),
                "kv_groups": len(runner.kv_cache_config.kv_cache_groups),
            }
            self.count += 1

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as file:
            file.write(json.dumps(record, separators=(",", ":")) + "\n")


class _Idle(StepTap):
    """Not recording: no step is ever begun, so every wrapper (and the draft hook) passes through."""

    def begin(self, runner: Any, scheduler_output: Any) -> None:
        pass


_IDLE = _Idle(None)
_TAP: StepTap = _IDLE
_ORIGINALS: dict[tuple[type, str], Any] = {}
_HOOKED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # draft models whose forwards are recorded


def install(folder: str | os.PathLike[str]) -> None:
    """Wrap the runner's methods in this process (once), writing records under `folder` from now on."""
    global _TAP
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    # vLLM loads its plugins once per process, before its engine runs a step: a new tap loses no step.
    uninstall()
    _TAP = StepTap(Path(folder) / f"engine-{os.getpid()}.jsonl")
    _wrap(GPUModelRunner, "execute_model", _execute_model)
    _wrap(GPUModelRunner, "_prepare_inputs", _prepare_inputs)
    _wrap(GPUModelRunner, "_model_forward", _model_forward)
    _wrap(GPUModelRunner, "_sample", _sample)
    _wrap(GPUModelRunner, "sample_tokens", _sample_tokens)
    _wrap(SpecDecodeBaseProposer, "propose", _propose)


def uninstall() -> None:
    """Put vLLM's own methods back; this process records nothing more."""
    global _TAP
    for (cls, name), original in _ORIGINALS.items():
        setattr(cls, name, original)
    _ORIGINALS.clear()
    _TAP = _IDLE


def _wrap(cls: type, name: str, wrapper: Any) -> None:
    original = _ORIGINALS[(cls, name)] = cls.__dict__[name]

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        return wrapper(original, self, *args, **kwargs)

    wrapped.__name__, wrapped.__wrapped__ = name, original  # type: ignore[attr-defined]
    setattr(cls, name, wrapped)


def _ints(t: Any) -> list[int]:
    """A tensor, array or list, flattened to Python ints (a copy: the runner reuses its buffers)."""
    return torch.as_tensor(t).reshape(-1).tolist()


def _new_request(req: Any) -> dict[str, Any]:
    """A request as the scheduler first hands it over: its prompt and what ends it."""
    params = req.sampling_params or _NO_PARAMS
    prompt, stop_ids = list(req.prompt_token_ids or []), sorted(params.all_stop_token_ids)
    # min_tokens: vLLM masks its stop tokens until then, so the oracle must too.
    said = {"max_tokens": params.max_tokens, "min_tokens": params.min_tokens, "stop_ids": stop_ids}
    return {"req_id": req.req_id, "prompt": prompt, "temperature": float(params.temperature), **said}


def _execute_model(original: Any, runner: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
    _TAP.begin(runner, scheduler_output)
    return original(runner, scheduler_output, *args, **kwargs)


def _prepare_inputs(original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    out = original(runner, *args, **kwargs)
    step = _TAP.step
    if step is not None:
        step["req_ids"] = list(runner.input_batch.req_ids)
        step["spec"] = _spec(out[1], len(step["req_ids"]))
    return out


def _spec(spec: Any, batch: int) -> dict[str, list[int]]:
    """The SpecDecodeMetadata's lists; a step without drafts has none: request i's one logits row is row i."""
    if spec is None:
        no_drafts = {"draft_token_ids": [], "num_draft_tokens": [0] * batch, "target_logits_indices": []}
        return {**no_drafts, "bonus_logits_indices": list(range(batch))}
    return {name: _ints(getattr(spec, name)) for name in SPEC}


def _fed(step: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A forward's (the target's, a draft call's) real tokens (None: embeddings fed) and attention metadata."""
    from vllm.forward_context import get_forward_context

    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, list) or not metadata:
        return {"unreadable": "the forward had micro-batches or no attention metadata"}
    first = next(iter(metadata.values()))
    needed = ("query_start_loc", "seq_lens", "block_table", "slot_mapping")
    if not all(hasattr(first, name) for name in needed):
        return {"unreadable": f"attention metadata {type(first).__name__} lacks {', '.join(needed)}"}
    num_reqs, bs = len(first.seq_lens), step["block_size"]
    seq_lens, qsl = _ints(first.seq_lens), _ints(first.query_start_loc[: num_reqs + 1])
    blocks = [-(-n // bs) for n in seq_lens]  # blocks each request's seq_len spans
    table = first.block_table[:num_reqs, : max(blocks, default=0)].tolist()  # one copy: [B, max blocks]
    fed = {name: kwargs.get(name) for name in ("input_ids", "positions")}
    return {
        **{name: None if t is None else _ints(t[: qsl[-1]]) for name, t in fed.items()},
        "query_start_loc": qsl,
        "seq_lens": seq_lens,
        "block_table": [row[:b] for row, b in zip(table, blocks)],
        "slot_mapping": _ints(first.slot_mapping[: int(first.num_actual_tokens)]),
    }


def _model_forward(original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    step = _TAP.step
    if step is not None:  # the target's forward: execute_model calls it once
        step["fed"] = _fed(step, kwargs)
    return original(runner, *args, **kwargs)


def _sample(original: Any, runner: Any, logits: Any, spec: Any, *args: Any, **kwargs: Any) -> Any:
    out = original(runner, logits, spec, *args, **kwargs)
    step = _TAP.drafting
    if step is not None:  # logits: always a tensor in vLLM 0.32 (a non-last pipeline rank's are broadcast)
        step["argmax"] = _ints(logits.argmax(dim=-1))  # [logits rows]: the target's choice at each
        sampled = out.sampled_token_ids.detach().cpu()  # [B, max_spec_len + 1], rejected places -1
        step["sampled"] = [row[row >= 0].tolist() for row in sampled]
    return out


def _sample_tokens(original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    tap, step = _TAP, _TAP.step
    if step is None:
        return original(runner, *args, **kwargs)
    tap.step, tap.drafting, step["draft_calls"] = None, step, []
    try:
        return original(runner, *args, **kwargs)
    finally:
        tap.drafting = None
        tap.write(step)


def _propose(original: Any, proposer: Any, *args: Any, **kwargs: Any) -> Any:
    # The draft model (an nn.Module since the runner's load_model) is hooked once; the hook records
    # only while a step is sampling, so it may outlive the watch.
    if proposer.model not in _HOOKED:
        proposer.model.register_forward_pre_hook(_draft_call, with_kwargs=True)
        _HOOKED.add(proposer.model)
    return original(proposer, *args, **kwargs)


def _draft_call(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    step = _TAP.drafting
    if step is not None:
        step["draft_calls"].append(_fed(step, kwargs))
