"""Real bugs of the last year, injected into vLLM 0.32 at run time (pytest's monkeypatch; no vLLM
file is edited). Each wraps one of vLLM's own functions, changes one decision, and logs where it
changed something: (runner step, batch row, request id), the runner step counted from the fault's
install, as the watch counts steps. The forensics never read the log; the tests compare it with
what the check found.

- `batch-order` (vLLM PR #14645): the tokens scheduled per row taken in the order of the keys of
  the scheduler's `num_scheduled_tokens` dict instead of `input_batch.req_ids`: once the two orders
  differ (a finished request's row refilled) and the counts differ, rows get other rows' spans;
- `draft-slot-lag` (vLLM #54498): a draft step's KV slot computed from a position coordinate that
  lags the absolute index (an M-RoPE temporal coordinate behind an image's patches): the drafted
  token's KV lands in a prompt slot, for the request that carries the "image" (one batch row);
- `draft-position-early` (SGLang PR #25015): the draft's positions advanced before the forward
  instead of after it: each later draft call is fed position + 1 (its slots stay right);
- `stale-token-map` (TensorRT-LLM PR #17240): the token-to-request map of the first draft pass
  (a request per token of its variable-length segments) reused for the later draft calls (one
  token per request): row i's KV goes to the blocks of the request that owned token i then. Right
  at batch 1 only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

FAULTS = ("batch-order", "draft-slot-lag", "draft-position-early", "stale-token-map")


@dataclass
class FaultLog:
    name: str
    steps: int = -1  # runner steps seen so far - 1 (the step in progress)
    events: list[tuple[int, int, str]] = field(default_factory=list)  # (runner step, row, req_id)

    def fired(self, row: int, req_id: str) -> None:
        self.events.append((self.steps, row, req_id))


def inject(name: str, monkeypatch: Any, lag_row: int = 5, lag: int = 4) -> FaultLog:
    """Patch vLLM with fault `name`; the returned log fills as it fires."""
    from vllm.v1.spec_decode import llm_base_proposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    log = FaultLog(name)
    runner_of: dict[str, Any] = {}

    def count_steps(original: Any) -> Any:
        def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            if scheduler_output.total_num_scheduled_tokens:
                log.steps += 1
                runner_of["runner"] = self
            return original(self, scheduler_output, *args, **kwargs)

        return execute_model

    monkeypatch.setattr(GPUModelRunner, "execute_model", count_steps(GPUModelRunner.execute_model))
    if name == "batch-order":
        _batch_order(monkeypatch, GPUModelRunner, log)
    elif name == "draft-slot-lag":
        _slot_update(monkeypatch, llm_base_proposer, log, runner_of, _lagged(lag_row, lag))
    elif name == "draft-position-early":
        _position_early(monkeypatch, llm_base_proposer.SpecDecodeBaseProposer, log, runner_of)
    elif name == "stale-token-map":
        _stale_map(monkeypatch, llm_base_proposer, log, runner_of)
    else:
        raise ValueError(f"unknown fault {name!r}; one of {FAULTS}")
    return log


def _batch_order(monkeypatch: Any, runner_cls: type, log: FaultLog) -> None:
    original = runner_cls._prepare_inputs

    def _prepare_inputs(self: Any, scheduler_output: Any, num_scheduled_tokens: np.ndarray) -> Any:
        in_dict_order = np.array(list(scheduler_output.num_scheduled_tokens.values()), dtype=num_scheduled_tokens.dtype)
        for row, (right, wrong) in enumerate(zip(num_scheduled_tokens, in_dict_order)):
            if right != wrong:
                log.fired(row, self.input_batch.req_ids[row])
        return original(self, scheduler_output, in_dict_order)

    monkeypatch.setattr(runner_cls, "_prepare_inputs", _prepare_inputs)


def _slot_update(monkeypatch: Any, module: Any, log: FaultLog, runner_of: dict[str, Any], change: Any) -> None:
    """Wrap the draft loop's slot/position update (one call per draft step after the first)."""
    original = module.eagle_step_update_slot_mapping_and_metadata

    def update(**kwargs: Any) -> None:
        original(**kwargs)
        for row in change(kwargs):
            log.fired(row, runner_of["runner"].input_batch.req_ids[row])

    monkeypatch.setattr(module, "eagle_step_update_slot_mapping_and_metadata", update)


def _lagged(lag_row: int, lag: int) -> Any:
    def change(kwargs: dict[str, Any]) -> list[int]:
        positions, table = kwargs["out_clamped_positions"], kwargs["block_table_tensor"]
        if positions.shape[0] <= lag_row:
            return []
        bs = kwargs["block_size"]
        pos = max(int(positions[lag_row]) - lag, 0)  # the lagging coordinate, not the absolute index
        kwargs["out_slot_mapping"][lag_row] = int(table[lag_row, pos // bs]) * bs + pos % bs
        return [lag_row]

    return change


def _position_early(monkeypatch: Any, proposer_cls: type, log: FaultLog, runner_of: dict[str, Any]) -> None:
    original = proposer_cls._update_positions_dependent_metadata

    def update(self: Any, positions: Any, common_attn_metadata: Any, batch_size: int, *args: Any) -> Any:
        out = original(self, positions, common_attn_metadata, batch_size, *args)
        self.positions[:batch_size] += 1  # advanced once more before the forward reads them
        for row in range(batch_size):
            log.fired(row, runner_of["runner"].input_batch.req_ids[row])
        return out

    monkeypatch.setattr(proposer_cls, "_update_positions_dependent_metadata", update)


def _stale_map(monkeypatch: Any, module: Any, log: FaultLog, runner_of: dict[str, Any]) -> None:
    """The first pass's token -> request map (from its query_start_loc), kept for the later calls."""
    proposer_cls = module.SpecDecodeBaseProposer
    first_pass = proposer_cls.set_inputs_first_pass
    owners: dict[str, torch.Tensor] = {}

    def set_inputs_first_pass(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = first_pass(self, *args, **kwargs)
        starts = out[2].query_start_loc_cpu  # [B + 1] of the first pass
        counts = (starts[1:] - starts[:-1]).long()
        owners["of_token"] = torch.repeat_interleave(torch.arange(len(counts)), counts)  # [first-pass tokens]
        return out

    def change(kwargs: dict[str, Any]) -> list[int]:
        positions, table = kwargs["out_clamped_positions"], kwargs["block_table_tensor"]
        batch, bs = positions.shape[0], kwargs["block_size"]
        owner = owners["of_token"][:batch]  # token i's request in the first pass, taken as row i's
        moved = []
        for row in range(batch):
            if int(owner[row]) != row:
                pos = int(positions[row])
                kwargs["out_slot_mapping"][row] = int(table[int(owner[row]), pos // bs]) * bs + pos % bs
                moved.append(row)
        return moved

    monkeypatch.setattr(proposer_cls, "set_inputs_first_pass", set_inputs_first_pass)
    _slot_update(monkeypatch, module, log, runner_of, change)
