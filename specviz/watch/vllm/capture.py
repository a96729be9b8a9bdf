"""What vLLM's model runner declares each step, copied out as plain records (runs inside vLLM).

The runner is wrapped at run time, never edited: `install()` replaces four methods of vLLM's
`GPUModelRunner` (which `CPUModelRunner` extends) and one of its speculative proposer with thin
wrappers that call the original and copy what it built or was fed:

- `execute_model`: one runner step; a step is one that schedules tokens (dummy and profile runs
  never enter it), the first is step 0. Reads the scheduler's output (new requests with their
  prompts and sampling parameters, finished ids, tokens scheduled per request) and the batch order
  `input_batch.req_ids` after the runner's own reordering;
- `_prepare_inputs`: the logits indices and the `SpecDecodeMetadata` (drafts per request);
- `_model_forward`: what the target was fed (input ids, positions) and the attention metadata in
  force (query_start_loc, seq_lens, block table, slot_mapping), read from vLLM's forward context;
- `_sample`: the target's argmax at each logits row, and the sampled tokens per request (the
  rejection sampler's [B, max_spec_len + 1], rejected places -1);
- the drafter's model forwards during `propose` (a pre-hook): each draft call's input, positions
  and metadata, which the next step's drafts come from.

Each step becomes one JSON line in `<dir>/engine-<pid>.jsonl`, flushed as it is written, so the
process that reads them (the watch) may be another one (`VLLM_ENABLE_V1_MULTIPROCESSING=1`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

FORMAT = 1  # of a record line; the reader refuses other versions


class StepTap:
    """The records of one runner process: the step being built, and the file it goes to."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / f"engine-{os.getpid()}.jsonl"
        self.file = self.path.open("a", encoding="utf-8")
        self.count = 0  # runner steps that scheduled tokens
        self.step: dict[str, Any] | None = None  # the step between execute_model and sample_tokens
        self.drafting: dict[str, Any] | None = None  # the step in sample_tokens (sampling, then proposing)

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.file.flush()


_TAP: StepTap | None = None
_ORIGINALS: dict[tuple[type, str], Any] = {}


def install(folder: str | os.PathLike[str]) -> None:
    """Wrap the runner's methods in this process (idempotent), writing records under `folder`."""
    global _TAP
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if _TAP is None or _TAP.path.parent != Path(folder) or _TAP.path.name != f"engine-{os.getpid()}.jsonl":
        _TAP = StepTap(Path(folder))
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
    if _TAP is not None:
        _TAP.file.close()
        _TAP = None


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
    if isinstance(t, torch.Tensor):  # on the CPU backend already; .tolist() copies
        return (t if t.device.type == "cpu" else t.cpu()).reshape(-1).tolist()
    return [int(v) for v in t]


def _execute_model(original: Any, runner: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
    tap = _TAP
    if tap is None or not scheduler_output.total_num_scheduled_tokens:
        return original(runner, scheduler_output, *args, **kwargs)
    tap.step = {
        "format": FORMAT,
        "step": tap.count,
        "new": [_new_request(r) for r in scheduler_output.scheduled_new_reqs],
        "finished": sorted(scheduler_output.finished_req_ids),
        "scheduled_drafts": {k: list(v) for k, v in scheduler_output.scheduled_spec_decode_tokens.items()},
        "block_size": int(runner.cache_config.block_size),
        "kv_groups": len(runner.kv_cache_config.kv_cache_groups),
    }
    if tap.count == 0:
        tap.step["engine"] = _engine(runner)
    tap.count += 1
    try:
        return original(runner, scheduler_output, *args, **kwargs)
    finally:
        step = tap.step
        if step is not None and "req_ids" in step:
            step["scheduled"] = [int(scheduler_output.num_scheduled_tokens[r]) for r in step["req_ids"]]


def _engine(runner: Any) -> dict[str, Any]:
    """The models and the speculative method, once per process."""
    import vllm

    spec = runner.speculative_config
    draft = getattr(spec, "draft_model_config", None) if spec is not None else None
    return {
        "vllm": vllm.__version__,
        "model": str(runner.model_config.model),
        "dtype": str(runner.model_config.dtype).replace("torch.", ""),
        "device": str(runner.device),
        "method": spec.method if spec is not None else None,
        "k": int(spec.num_speculative_tokens) if spec is not None else 0,
        "draft_model": str(draft.model) if draft is not None and spec.method == "draft_model" else None,
        "async_scheduling": bool(runner.scheduler_config.async_scheduling),
    }


def _new_request(req: Any) -> dict[str, Any]:
    """A request as the scheduler first hands it over: its prompt and what ends it."""
    params = req.sampling_params
    return {
        "req_id": req.req_id,
        "prompt": list(req.prompt_token_ids or []),
        "max_tokens": params.max_tokens if params is not None else None,
        "stop_ids": sorted(params.all_stop_token_ids) if params is not None else [],
        "ignore_eos": bool(params.ignore_eos) if params is not None else False,
        "min_tokens": int(params.min_tokens) if params is not None else 0,
        "temperature": float(params.temperature) if params is not None else 0.0,
    }


def _prepare_inputs(original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    out = original(runner, *args, **kwargs)
    step = _TAP.step if _TAP is not None else None
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
    step = _TAP.step if _TAP is not None else None
    return int(step["block_size"]) if step is not None else 16


def _model_forward(original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    step = _TAP.step if _TAP is not None else None
    if step is not None and "fed" not in step:
        metadata = _forward_metadata()
        count = int(metadata["query_start_loc"][-1]) if "query_start_loc" in metadata else None
        input_ids, positions = kwargs.get("input_ids"), kwargs.get("positions")
        step["fed"] = {
            "input_ids": _ints(input_ids[:count]) if input_ids is not None else None,
            "positions": _ints(positions[:count]) if positions is not None else None,
            **metadata,
        }
    return original(runner, *args, **kwargs)


def _sample(original: Any, runner: Any, logits: Any, spec: Any, *args: Any, **kwargs: Any) -> Any:
    out = original(runner, logits, spec, *args, **kwargs)
    step = _TAP.drafting if _TAP is not None else None
    if step is not None and logits is not None:
        step["argmax"] = _ints(logits.argmax(dim=-1))  # [logits rows]: the target's choice at each
        step["sampled"] = out.sampled_token_ids.detach().to("cpu").tolist()  # [B, max_spec_len + 1]
    return out


def _sample_tokens(original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    tap = _TAP
    if tap is None or tap.step is None:
        return original(runner, *args, **kwargs)
    step, tap.step = tap.step, None
    step["draft_calls"] = []
    tap.drafting = step
    try:
        return original(runner, *args, **kwargs)
    finally:
        tap.drafting = None
        tap.write(step)


def _propose(original: Any, proposer: Any, *args: Any, **kwargs: Any) -> Any:
    tap = _TAP
    model = getattr(proposer, "model", None)
    if tap is not None and isinstance(model, torch.nn.Module) and not getattr(model, "_specviz_hooked", False):
        model.register_forward_pre_hook(_draft_call, with_kwargs=True)
        model._specviz_hooked = True
    return original(proposer, *args, **kwargs)


def _draft_call(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    step = _TAP.drafting if _TAP is not None else None
    if step is None:
        return
    metadata = _forward_metadata()
    count = int(metadata["query_start_loc"][-1]) if "query_start_loc" in metadata else None
    input_ids, positions = kwargs.get("input_ids"), kwargs.get("positions")
    step["draft_calls"].append(
        {
            "input_ids": _ints(input_ids[:count]) if input_ids is not None else None,
            "positions": _ints(positions[:count]) if positions is not None else None,
            **metadata,
        }
    )
