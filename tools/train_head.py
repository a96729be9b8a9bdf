"""Training the EAGLE-style draft head for the saved target (`python -m tools.train_default_models
--head`): the target's own greedy continuations as data, a chained next-token and next-state loss,
then acceptance against the draft model with specviz's engine.

Imported by `tools/train_default_models.py`, which sets OMP_WAIT_POLICY before torch loads.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import PreTrainedModel

from tools.train_common import RunConfig, Timer, encode, load_pair, load_split, lr_at, seed_all
from tools.train_distill import build_distill_set

# --------------------------------------------------------------------------- the draft head


@dataclass(frozen=True)
class HeadConfig:
    """The head's size and training; sized for a few minutes on 2 shared cores."""

    seed: int = 1234
    inner: int = 512
    # Training data: the target's own greedy continuations of train-prompt prefixes (what the head
    # must predict to be accepted), as for the draft; the target's hidden states are computed once.
    prefixes: int = 768
    new_tokens: int = 80
    window: int = 96  # positions per sequence kept for training: the continuation and a little context
    batch: int = 24
    steps: int = 500
    lr: float = 2e-3
    unroll: int = 3  # the head runs k steps on its own outputs: train it on 3 chained steps
    feature_weight: float = 0.1  # next-hidden-state regression, beside the next-token loss
    eval_prompts: int = 16
    eval_new_tokens: int = 64
    eval_k: int = 4
    eval_batch: int = 8
    threads: int = 2


@torch.no_grad()
def head_dataset(
    target: PreTrainedModel, docs: list[list[int]], answers: list[list[int]], cfg: HeadConfig, rng: random.Random
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token ids [M, W], the target's last hidden states there [M, W, H], its greedy choice [M, W])
    over the last W positions of prefix + greedy continuation, for `cfg.prefixes` train prefixes and
    every `answers` prefix (a train question followed by the separator the app puts after it)."""
    usable = [d for d in docs if len(d) > 2]
    cuts = usable + [d[: rng.randint(2, len(d) - 1)] for d in usable]  # whole documents and a random cut of each
    cuts = rng.sample(cuts, min(cfg.prefixes, len(cuts))) + answers  # and every question as the app asks it
    distill = replace(RunConfig(), distill_new_tokens=cfg.new_tokens)
    pairs = build_distill_set(target, [c[-distill.distill_max_prefix :] for c in cuts], distill)
    by_length: dict[int, list[list[int]]] = {}
    for tokens, _ in pairs:
        by_length.setdefault(len(tokens), []).append(tokens)
    ids, hidden, choice = [], [], []
    for length, group in sorted(by_length.items()):
        if length < cfg.window:
            continue
        for start in range(0, len(group), 16):
            batch = torch.tensor(group[start : start + 16])
            states = target.model(input_ids=batch).last_hidden_state[:, -cfg.window :]  # the LM head's input
            ids.append(batch[:, -cfg.window :])
            hidden.append(states)
            choice.append(target.lm_head(states).argmax(-1))
    return torch.cat(ids), torch.cat(hidden), torch.cat(choice)


def head_loss(
    head: torch.nn.Module, target: PreTrainedModel, data: tuple[torch.Tensor, ...], rows: torch.Tensor, cfg: HeadConfig
) -> torch.Tensor:
    """From h_t and the embedding of x_(t+1) predict h_(t+1) and the target's next token there;
    then chain the prediction for `unroll` steps, as decoding does."""
    ids, hidden, choice = (t[rows] for t in data)
    embed = target.get_input_embeddings()
    steps = ids.shape[1] - cfg.unroll
    state = hidden[:, :steps]
    loss = torch.zeros(())
    for j in range(1, cfg.unroll + 1):
        state = head(state, embed(ids[:, j : j + steps]))
        logits = target.lm_head(state)
        loss = loss + F.cross_entropy(logits.flatten(0, 1), choice[:, j : j + steps].flatten())
        loss = loss + cfg.feature_weight * F.smooth_l1_loss(state, hidden[:, j : j + steps])
    return loss / cfg.unroll


def engine_acceptance(out: Path, proposer: str, prompts: list[str], cfg: HeadConfig) -> dict[str, float]:
    """Acceptance rate and mean acceptance length of one proposer with specviz's engine (EQSPEC)."""
    from specviz.analysis.metrics import acceptance
    from specviz.engine.config import RunConfig as EngineRunConfig
    from specviz.engine.models import load_pair as load_engine_pair
    from specviz.engine.run import run as engine_run

    pair = load_engine_pair(str(out / "default-target"), str(out / "default-draft"), device="cpu")
    config = EngineRunConfig(
        method="eqspec",
        batch_size=cfg.eval_batch,
        draft_k=cfg.eval_k,
        max_new_tokens=cfg.eval_new_tokens,
        proposer=proposer,
        head_path=str(out / "default-head") if proposer == "head" else None,
    )
    trace = engine_run(pair, prompts, config)
    total, _ = acceptance(trace)
    exact = sum(s.output_ids == s.reference_ids for s in trace.sequences) / len(trace.sequences)
    return {"acceptance_rate": round(total.rate, 4), "mean_acceptance_length": round(total.mean_length, 3),
            "exact": exact}  # fmt: skip


def run_head(cfg: HeadConfig, out: Path) -> dict[str, object]:
    """Train the head on the saved target, save it, reload it and compare it with the draft."""
    from specviz.data import load_specbench
    from specviz.engine.proposers.head import EagleHead, load_head

    torch.set_num_threads(cfg.threads)
    seed_all(cfg.seed)
    rng = random.Random(cfg.seed)
    timer = Timer()
    tokenizer, target, _ = load_pair(out)
    for p in target.parameters():
        p.requires_grad_(False)
    train_texts, _ = load_split()
    questions = encode(tokenizer, load_specbench("train"))  # first turns, each followed by the separator
    data = head_dataset(target, encode(tokenizer, train_texts), questions, cfg, rng)
    timer.lap("head_data")
    head = EagleHead.for_target(target, inner=cfg.inner, seed=cfg.seed).train()
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.01)
    tail: list[float] = []
    bar = tqdm(range(cfg.steps), desc="head", mininterval=2.0)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.steps, cfg.lr)
        rows = torch.randint(0, data[0].shape[0], (cfg.batch,))
        loss = head_loss(head, target, data, rows, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        if step >= cfg.steps - max(1, cfg.steps // 10):
            tail.append(loss.item())
    timer.lap("head_train")
    head.eval().save(
        out / "default-head", meta={"target": "default-target", "trained_by": "tools/train_default_models.py --head"}
    )
    load_head(out / "default-head", target)  # it reloads
    timer.lap("save_reload")
    heldout = load_specbench("heldout")  # the vendored prompts as the app and `record` send them
    step = max(1, len(heldout) // cfg.eval_prompts)
    prompts = heldout[::step][: cfg.eval_prompts]
    report: dict[str, object] = {
        "head_train_loss": round(sum(tail) / len(tail), 4),
        "head_params": sum(p.numel() for p in head.parameters()),
        "head_train_sequences": data[0].shape[0],
        "head_bytes": (out / "default-head" / "head.safetensors").stat().st_size,
        "heldout_prompts": len(prompts),
        "head": engine_acceptance(out, "head", prompts, cfg),
        "draft_model": engine_acceptance(out, "draft-model", prompts, cfg),
        "config": asdict(cfg),
    }
    timer.lap("eval")
    report["timings_s"] = {**timer.phases, "total": round(time.perf_counter() - timer.start, 1)}
    print(json.dumps(report, indent=2))
    return report
