"""What vLLM's model runner declares each step, copied out as plain records (runs inside vLLM).

`install()` wraps, at run time, five methods of vLLM's `GPUModelRunner` (which `CPUModelRunner`
extends) and its speculative proposer's `propose`; each wrapper calls the original and copies what
it built or was fed (docs/vllm.md section 3 lists what is read where). A step is one
`execute_model` that schedules tokens (dummy and profile runs never enter it); the first is step 0.
Each becomes one JSON line in `<dir>/engine-<pid>.jsonl`, flushed as it is written, so the process
that reads them (the watch) may be another one (`VLLM_ENABLE_V1_MULTIPROCESSING=1`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

FORMAT = 1  # of a record line; the reader refuses other versions
# A request without sampling parameters (a pooling request): no budget, no stop token, greedy.
_NO_PARAMS = SimpleNamespace(max_tokens=None, all_stop_token_ids=(), ignore_eos=False, min_tokens=0, temperature=0.0)
_NO_SPEC = SimpleNamespace(method=None, num_speculative_tokens=0, draft_model_config=None)  # no speculation


class StepTap:
    """The records of one runner process: the step being built, and the file it goes to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = self.path.open("a", encoding="utf-8")
        self.count = 0  # runner steps that scheduled tokens
        self.step: dict[str, Any] | None = None  # the step between execute_model and sample_tokens
        self.drafting: dict[str, Any] | None = None  # the step in sample_tokens (sampling, then proposing)

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


# Not recording (nothing installed here, or uninstalled while a wrapper or the draft hook is still
# reachable): no step is ever built, so every wrapper passes straight through.
_IDLE = SimpleNamespace(path=None, step=None, drafting=None, close=lambda: None)
_TAP: StepTap | SimpleNamespace = _IDLE
_ORIGINALS: dict[tuple[type, str], Any] = {}


def install(folder: str | os.PathLike[str]) -> None:
    """Wrap the runner's methods in this process (idempotent), writing records under `folder`."""
    global _TAP
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    path = Path(folder) / f"engine-{os.getpid()}.jsonl"
    if _TAP.path != path:  # a new folder, or a process forked from a recording one
        _TAP = StepTap(path)
    _wrap(GPUModelRunner, "execute_model", _execute_model)
    _wrap(GPUModelRunner, "_prepare_inputs", _prepare_inputs)
    _wrap(GPUModelRunner, "_model_forward", _model_forward)
    _wrap(GPUModelRunner, "_sample", _sample)
    _wrap(GPUModelRunner, "sample_tokens", _sample_tokens)
    _wrap(SpecDecodeBaseProposer, "propose", _propose)


def uninstall() -> None:
    """Put vLLM's own methods back and close the record file."""
    global _TAP
    for (cls, name), original in _ORIGINALS.items():
        setattr(cls, name, original)
    _ORIGINALS.clear()
    _TAP.close()
    _TAP = _IDLE


def _wrap(cls: type, name: str, wrapper: Any) -> None:
    if (cls, name) in _ORIGINALS:
        return
    original = cls.__dict__[name]
    _ORIGINALS[(cls, name)] = original

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        return wrapper(original, self, *args, **kwargs)

    wrapped.__name__ = name
    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(cls, name, wrapped)


def _ints(t: Any) -> list[int]:
    """A tensor or array, flattened to Python ints (a copy: the runner reuses its buffers)."""
    if isinstance(t, torch.Tensor):  # .cpu() is the tensor itself on the CPU backend; .tolist() copies
        return t.cpu().reshape(-1).tolist()
    return [int(v) for v in t]


def _execute_model(original: Any, runner: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
    tap = _TAP
    if tap is _IDLE or not scheduler_output.total_num_scheduled_tokens:
        return original(runner, scheduler_output, *args, **kwargs)
    tap.step = step = {
        "format": FORMAT,
        "step": tap.count,
        "new": [_new_request(r) for r in scheduler_output.scheduled_new_reqs],
        "finished": sorted(scheduler_output.finished_req_ids),
        "scheduled_drafts": {k: list(v) for k, v in scheduler_output.scheduled_spec_decode_tokens.items()},
        "block_size": int(runner.cache_config.block_size),
        "kv_groups": len(runner.kv_cache_config.kv_cache_groups),
    }
    if tap.count == 0:
        step["engine"] = _engine(runner)
    tap.count += 1
    try:
        return original(runner, scheduler_output, *args, **kwargs)
    finally:
        if "req_ids" in step:  # _prepare_inputs ran
            step["scheduled"] = [int(scheduler_output.num_scheduled_tokens[r]) for r in step["req_ids"]]


def _engine(runner: Any) -> dict[str, Any]:
    """The models and the speculative method, once per process."""
    import vllm

    spec = runner.speculative_config or _NO_SPEC
    draft = spec.draft_model_config  # a head's or the target's for other methods than draft_model
    return {
        "vllm": vllm.__version__,
        "model": str(runner.model_config.model),
        "dtype": str(runner.model_config.dtype).replace("torch.", ""),
        "device": str(runner.device),
        "method": spec.method,
        "k": int(spec.num_speculative_tokens),
        "draft_model": str(draft.model) if draft is not None and spec.method == "draft_model" else None,
        "async_scheduling": bool(runner.scheduler_config.async_scheduling),
    }


def _new_request(req: Any) -> dict[str, Any]:
    """A request as the scheduler first hands it over: its prompt and what ends it."""
    params = req.sampling_params or _NO_PARAMS
    return {
        "req_id": req.req_id,
        "prompt": list(req.prompt_token_ids or []),
        "max_tokens": params.max_tokens,
        "stop_ids": sorted(params.all_stop_token_ids),
        "ignore_eos": bool(params.ignore_eos),
        "min_tokens": int(params.min_tokens),
        "temperature": float(params.temperature),
    }


def _prepare_inputs(original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    out = original(runner, *args, **kwargs)
    step = _TAP.step
    if step is not None:
        logits_indices, spec, _ = out
        step["req_ids"] = list(runner.input_batch.req_ids)
        step["logits_indices"] = _ints(logits_indices)
        if spec is not None:
            step["spec"] = {
                "draft_token_ids": _ints(spec.draft_token_ids),
                "num_draft_tokens": [int(n) for n in spec.num_draft_tokens],
                "target_logits_indices": _ints(spec.target_logits_indices),
                "bonus_logits_indices": _ints(spec.bonus_logits_indices),
                "logits_indices": _ints(spec.logits_indices),
            }
    return out


def _forward_metadata() -> dict[str, Any]:
    """The attention metadata of the forward in progress: its first layer's (a runner with more than
    one KV cache group, one block table each, is recorded as unreadable by the reader)."""
    from vllm.forward_context import get_forward_context

    context = get_forward_context()
    metadata = context.attn_metadata
    if isinstance(metadata, list) or not metadata:
        return {"unreadable": "the forward had micro-batches or no attention metadata"}
    first = next(iter(metadata.values()))
    needed = ("query_start_loc", "seq_lens", "block_table", "slot_mapping")
    if not all(hasattr(first, name) for name in needed):
        return {"unreadable": f"attention metadata {type(first).__name__} lacks {', '.join(needed)}"}
    num_reqs = len(first.seq_lens)
    seq_lens = _ints(first.seq_lens)
    bs = _block_size()
    blocks = [-(-n // bs) for n in seq_lens]  # blocks each request's seq_len spans
    table = first.block_table[:num_reqs, : max(blocks, default=0)].tolist()  # one copy: [B, max blocks]
    return {
        "query_start_loc": _ints(first.query_start_loc[: num_reqs + 1]),
        "seq_lens": seq_lens,
        "block_table": [row[:b] for row, b in zip(table, blocks)],
        "slot_mapping": _ints(first.slot_mapping[: int(first.num_actual_tokens)]),
    }


def _block_size() -> int:
    # The draft calls run in sample_tokens, once the step is built: the step being drafted says the
    # run's block size then. With neither (a forward outside any step), 16-token blocks keep at least
    # the blocks a request spans for any block size >= 16 (the CPU default is 128).
    step = _TAP.step or _TAP.drafting
    return int(step["block_size"]) if step is not None else 16


def _fed(kwargs: dict[str, Any]) -> dict[str, Any]:
    """What a forward (the target's or a draft call) was fed, its real tokens only (None: not given,
    e.g. embeddings fed instead), and its metadata."""
    metadata = _forward_metadata()
    count = int(metadata["query_start_loc"][-1]) if "query_start_loc" in metadata else None
    fed = {name: kwargs.get(name) for name in ("input_ids", "positions")}
    return {**{name: None if t is None else _ints(t[:count]) for name, t in fed.items()}, **metadata}


def _model_forward(original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    step = _TAP.step
    if step is not None and "fed" not in step:  # the target's first forward of the step
        step["fed"] = _fed(kwargs)
    return original(runner, *args, **kwargs)


def _sample(original: Any, runner: Any, logits: Any, spec: Any, *args: Any, **kwargs: Any) -> Any:
    out = original(runner, logits, spec, *args, **kwargs)
    step = _TAP.drafting
    if step is not None and logits is not None:
        step["argmax"] = _ints(logits.argmax(dim=-1))  # [logits rows]: the target's choice at each
        step["sampled"] = out.sampled_token_ids.detach().to("cpu").tolist()  # [B, max_spec_len + 1]
    return out


def _sample_tokens(original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    tap = _TAP
    step = tap.step
    if step is None:
        return original(runner, *args, **kwargs)
    tap.step, tap.drafting = None, step
    step["draft_calls"] = []
    try:
        return original(runner, *args, **kwargs)
    finally:
        tap.drafting = None
        tap.write(step)


def _propose(original: Any, proposer: Any, *args: Any, **kwargs: Any) -> Any:
    model = getattr(proposer, "model", None)
    # Hooked once; the hook records only while a step is sampling, so it may outlive the watch.
    if isinstance(model, torch.nn.Module) and not getattr(model, "_specviz_hooked", False):
        model.register_forward_pre_hook(_draft_call, with_kwargs=True)
        model._specviz_hooked = True
    return original(proposer, *args, **kwargs)


def _draft_call(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    step = _TAP.drafting
    if step is not None:
        step["draft_calls"].append(_fed(kwargs))
