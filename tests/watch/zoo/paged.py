"""transformers' own continuous batching (`model.generate_batch`, paged attention, greedy, CPU,
CUDA graphs off): every forward is one packed 1 x T row with `cu_seq_lens_q`/`cu_seq_lens_k`,
`read_index`/`write_index` over a paged cache, `logits_indices` and an additive block-diagonal
4-D mask (sdpa on CPU). At most `rows` requests run at once, so the last ones wait in the
manager's queue and join as others leave; their prefill shares a forward with the others'
decoding. With one budget for all, `generate_batch` itself runs; with a budget per request (a
list), the same manager is driven directly (`add_request(..., max_new_tokens=n)`). No draft
model: one new token per request per step (transformers has no speculative decoding here).

`emit`: how an API run declares the tokens. None (the default): nothing, as a plain
`generate_batch` caller has no per-step point to emit from (the watch reads the manager itself);
"step": after each forward, inside the manager's own update (`ContinuousBatchProcessor.
update_batch`), each request's new token is emitted, as an engine that reports per step would;
"end": each request's tokens in one emit after the run.

Bugs, injected between the manager and the model (`ModelRunner._forward_process_and_sample`
gets a corrupted copy of the kwargs, so the model is fed exactly what the watch sees), each at
(step, request) = events[0]:
- "positions": at forward 2 the second request that gets a token there is fed positions one
  too far (POSITIONS);
- "kv_leak": at forward 2 that request's query also attends its neighbour's first key (the mask
  lets a neighbour in; KV).
`tokens` below the longest prompt makes the manager cut prefills into chunks (forwards where a
request gets no token, and forwards of chunks only). `eos` is the stop token of every request
(the generation config's, not the model's): a request that emits it ends there.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.continuous_api import ContinuousBatchProcessor
from transformers.generation.continuous_batching.model_runner import ModelRunner

from .shapes import budgets

BUG_FORWARD = 2


def settings(rows: int, tokens: int) -> ContinuousBatchingConfig:
    """A small paged cache (16 pages of 16 slots), no CUDA graphs, at most `rows` requests and
    `tokens` query tokens a forward (fewer than a prompt: its prefill is cut into chunks)."""
    return ContinuousBatchingConfig(
        page_size=16, num_blocks=16, max_batch_tokens=tokens, max_requests_per_batch=rows, use_cuda_graph=False
    )


@torch.no_grad()
def generate(target, draft, prompts, max_new, bug=None, w=None, rows=3, emit=None, tokens=64, eos=1):
    limit = budgets(max_new, len(prompts))
    config = GenerationConfig(max_new_tokens=max(limit), do_sample=False, eos_token_id=eos, pad_token_id=0)
    events: list[tuple[int, int]] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(_inject(bug, events))
        if w is not None and emit == "step":
            stack.enter_context(_emit_each_step(w, limit, config.eos_token_id))
        if len(set(limit)) == 1:
            cb_config = settings(rows, tokens)
            results = target.generate_batch(
                inputs=prompts, generation_config=config, continuous_batching_config=cb_config, warmup=False
            )
            outs = [list(r.generated_tokens) for r in results.values()]
        else:
            outs = _manager_run(target, prompts, limit, config, settings(rows, tokens))
    if w is not None and emit == "end":
        for s, out in enumerate(outs):
            w.emit(s, out, "eos" if out and out[-1] == config.eos_token_id else "length")
    return outs, events


def _manager_run(target, prompts, limit, config, cb_config) -> list[list[int]]:
    """generate_batch's loop, with each request's own max_new_tokens."""
    done: dict[str, list[int]] = {}
    with target.continuous_batching_context_manager(
        generation_config=config, continuous_batching_config=cb_config, block=True, timeout=5, warmup=False
    ) as manager:
        for s, (prompt, n) in enumerate(zip(prompts, limit)):
            manager.add_request(prompt, request_id=f"req_{s}", max_new_tokens=n)
        while len(done) < len(prompts):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                done[result.request_id] = list(result.generated_tokens)
            elif result is None and not manager.is_running():
                raise RuntimeError("the continuous batching thread stopped before every request finished")
    return [done[f"req_{s}"] for s in range(len(prompts))]


def seq_of(request_id: str) -> int:
    return int(request_id.removeprefix("req_"))


@contextlib.contextmanager
def _inject(bug: str | None, events: list[tuple[int, int]]):
    """Corrupt the kwargs of forward BUG_FORWARD for the second request that gets a token there
    (the first if it is alone). The step is the count of earlier forwards that gave any request a
    token: a forward of prefill chunks only is no step."""
    if bug is None:
        yield
        return
    original = ModelRunner._forward_process_and_sample
    calls, steps = [0], [0]

    def corrupted(self, model, batch_data, *args):
        states = self.inputs_and_outputs.requests_in_batch
        if calls[0] == BUG_FORWARD:
            (i,) = [i for i, f in enumerate(states) if f.has_new_token][1:2] or [0]
            cu_q = batch_data["cu_seq_lens_q"].tolist()
            cu_k = batch_data["cu_seq_lens_k"]["full_attention"].tolist()
            neighbour = 1 if i == 0 else 0
            batch_data = dict(batch_data)
            if bug == "positions":
                positions = batch_data["position_ids"].clone()
                positions[0, cu_q[i] : cu_q[i + 1]] += 1
                batch_data["position_ids"] = positions
            elif bug == "kv_leak":
                mask = batch_data["attention_mask"].clone()
                mask[..., cu_q[i] : cu_q[i + 1], cu_k[neighbour]] = 0.0
                batch_data["attention_mask"] = mask
            else:
                raise ValueError(f"unknown bug {bug!r}")
            events.append((steps[0], seq_of(states[i].state.request_id)))
        calls[0] += 1
        steps[0] += any(f.has_new_token for f in states)
        return original(self, model, batch_data, *args)

    ModelRunner._forward_process_and_sample = corrupted
    try:
        yield
    finally:
        ModelRunner._forward_process_and_sample = original


@contextlib.contextmanager
def _emit_each_step(w, limit: list[int], eos: int):
    """After each forward's update, emit every request's new token (from the manager's thread)."""
    original = ContinuousBatchProcessor.update_batch

    def update(self):
        states = [f.state for f in self.inputs_and_outputs.requests_in_batch]
        before = [len(state.generated_tokens) for state in states]
        original(self)
        for state, n in zip(states, before):
            new = list(state.generated_tokens[n:])
            if new:
                s = seq_of(state.request_id)
                done = len(state.generated_tokens) >= limit[s] or new[-1] == eos
                w.emit(s, new, ("eos" if new[-1] == eos else "length") if done else None)

    ContinuousBatchProcessor.update_batch = update
    try:
        yield
    finally:
        ContinuousBatchProcessor.update_batch = original
