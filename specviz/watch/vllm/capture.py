"""What vLLM's model runner declares each step, copied out as plain records (runs inside vLLM; docs/vllm.md
section 3). `install()` wraps five methods of vLLM's `GPUModelRunner` (which `CPUModelRunner` extends) and
its proposer's `propose`: each calls the original and copies what it built or was fed. A step (an
`execute_model` that schedules tokens) becomes one JSON line appended to `<dir>/engine-<pid>.jsonl` as it ends."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

# A record line's format, 3: sampled rows without -1s; spec, engine, min_tokens and fed always (others refused).
FORMAT = 3
# A request without sampling parameters (a pooling request): no budget, no stop token, greedy.
_NO_PARAMS = SimpleNamespace(max_tokens=None, min_tokens=0, all_stop_token_ids=(), temperature=0.0)
_NO_SPEC = SimpleNamespace(method=None)  # no speculation
SPEC = ("draft_token_ids", "num_draft_tokens", "target_logits_indices", "bonus_logits_indices")
NO_FORWARD = {"unreadable": "no target forward was seen in this runner step"}  # until `_model_forward` reads one


@dataclass
class StepTap:
    """One runner process's records: its file, steps counted, the step being built and sampled. A wrapped
    vLLM method calls the installed tap's method of its name; the idle tap (no file) wraps nothing."""

    path: Path | None = None
    count: int = 0
    step: dict[str, Any] | None = None

    def execute_model(self, original: Any, runner: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.path.parent.is_dir():  # an engine core process outlives the `VllmWatch` that removed it
            uninstall()
        elif scheduler_output.total_num_scheduled_tokens:  # a step (dummy and profile runs never enter here)
            spec = runner.speculative_config or _NO_SPEC
            import vllm

            engine = {"vllm": vllm.__version__, "model": str(runner.model_config.model), "method": spec.method}
            # the draft model config of other methods is a head's or the target's
            engine["draft_model"] = str(spec.draft_model_config.model) if spec.method == "draft_model" else None
            self.step = {
                "format": FORMAT,
                "step": self.count,
                "engine": engine,
                "new": [_new_request(r) for r in scheduler_output.scheduled_new_reqs],
                "block_size": int(runner.cache_config.block_size),
                "kv_groups": len(runner.kv_cache_config.kv_cache_groups),
                "fed": NO_FORWARD,
                "draft_calls": [],
            }
            self.count += 1
        return original(runner, scheduler_output, *args, **kwargs)

    # vLLM 0.32 calls the methods below only inside a step begun (docs/vllm.md section 3).
    def _prepare_inputs(self, original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(runner, *args, **kwargs)
        self.step["req_ids"] = list(runner.input_batch.req_ids)
        self.step["spec"] = _spec(out[1], len(self.step["req_ids"]))
        return out

    def _model_forward(self, original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
        self.step["fed"] = _fed(self.step, kwargs)
        return original(runner, *args, **kwargs)

    def _sample(self, original: Any, runner: Any, logits: Any, spec: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(runner, logits, spec, *args, **kwargs)  # logits: a tensor (a non-last pipeline rank's broadcast)
        self.step["argmax"] = _ints(logits.argmax(dim=-1))  # [logits rows]: the target's choice at each
        sampled = out.sampled_token_ids.detach().cpu()  # [B, max_spec_len + 1], rejected places -1
        self.step["sampled"] = [row[row >= 0].tolist() for row in sampled]
        return out

    def propose(self, original: Any, proposer: Any, *args: Any, **kwargs: Any) -> Any:
        hook = proposer.model.register_forward_pre_hook(self._draft_call, with_kwargs=True)
        try:  # the draft model's forwards while it proposes are the step's draft calls
            return original(proposer, *args, **kwargs)
        finally:
            hook.remove()

    def _draft_call(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.step["draft_calls"].append(_fed(self.step, kwargs))

    def sample_tokens(self, original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(runner, *args, **kwargs)
        finally:  # the step ends: its record
            with self.path.open("a", encoding="utf-8") as file:
                file.write(json.dumps(self.step, separators=(",", ":")) + "\n")


_TAP = StepTap()
_ORIGINALS: dict[tuple[type, str], Any] = {}


def install(folder: str | os.PathLike[str]) -> None:
    """Wrap the runner's methods in this process (once), writing records under `folder` from now on."""
    global _TAP
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    # vLLM loads its plugins once per process, before its engine runs a step: a new tap loses no step.
    uninstall()
    _TAP = StepTap(Path(folder) / f"engine-{os.getpid()}.jsonl")
    for name in ("execute_model", "_prepare_inputs", "_model_forward", "_sample", "sample_tokens"):
        _wrap(GPUModelRunner, name)
    _wrap(SpecDecodeBaseProposer, "propose")


def uninstall() -> None:
    """Put vLLM's own methods back; this process records nothing more."""
    global _TAP
    for (cls, name), original in _ORIGINALS.items():
        setattr(cls, name, original)
    _ORIGINALS.clear()
    _TAP = StepTap()


def _wrap(cls: type, name: str) -> None:
    original = _ORIGINALS[(cls, name)] = cls.__dict__[name]

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(_TAP, name)(original, self, *args, **kwargs)

    wrapped.__name__, wrapped.__wrapped__ = name, original  # type: ignore[attr-defined]
    setattr(cls, name, wrapped)


def _ints(t: Any) -> list[int]:
    """A tensor, array or list, flattened to Python ints (a copy: the runner reuses its buffers)."""
    return torch.as_tensor(t).reshape(-1).tolist()


def _new_request(req: Any) -> dict[str, Any]:
    """A request as the scheduler first hands it over: its prompt and what ends it."""
    params, prompt = req.sampling_params or _NO_PARAMS, list(req.prompt_token_ids or [])
    stop_ids = sorted(params.all_stop_token_ids)  # min_tokens: vLLM masks them until then, so the oracle must too
    said = {"max_tokens": params.max_tokens, "min_tokens": params.min_tokens, "stop_ids": stop_ids}
    return {"req_id": req.req_id, "prompt": prompt, "temperature": float(params.temperature), **said}


def _spec(spec: Any, batch: int) -> dict[str, list[int]]:
    """The SpecDecodeMetadata's lists; a step without drafts has none: request i's one logits row is row i."""
    nothing = {"draft_token_ids": [], "num_draft_tokens": [0] * batch, "target_logits_indices": []}
    spec = spec or SimpleNamespace(**nothing, bonus_logits_indices=range(batch))
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
    return {
        **{k: None if kwargs.get(k) is None else _ints(kwargs[k][: qsl[-1]]) for k in ("input_ids", "positions")},
        "query_start_loc": qsl,
        "seq_lens": seq_lens,
        "block_table": [row[:b] for row, b in zip(table, blocks)],
        "slot_mapping": _ints(first.slot_mapping[: int(first.num_actual_tokens)]),
    }
