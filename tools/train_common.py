"""What both trainings of `tools/train_default_models.py` use: the run's settings, the corpus and
tokenizer, the Llama models and their training loop, saving and loading the pair, timing, seeds.

Imported by `tools/train_default_models.py`, which sets OMP_WAIT_POLICY before torch loads.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_PATH = REPO_ROOT / "specviz" / "data" / "spec_bench_question.jsonl"
EOS = "<|endoftext|>"
PAD = "<pad>"
IGNORE = -100


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of one Llama-style LM (vocab comes from the tokenizer)."""

    hidden: int
    layers: int
    heads: int
    ffn: int


@dataclass(frozen=True)
class RunConfig:
    """All knobs of one training run; ``--quick`` shrinks the step counts."""

    seed: int = 1234
    vocab_size: int = 2048
    max_positions: int = 4096
    # Sizes/steps tuned so the whole run takes ~8 min on 2 shared CPU cores. At
    # this compute budget (~1M tokens seen) a narrow model trained for more steps
    # beats a wider one trained for fewer (d=192 plateaued ~0.4 nats higher).
    target: ModelSpec = ModelSpec(hidden=128, layers=4, heads=4, ffn=384)
    draft: ModelSpec = ModelSpec(hidden=96, layers=2, heads=3, ffn=256)
    # Target pretraining on packed train text. Short windows give more optimizer
    # steps per second; measured loss does not degrade at positions up to ~2200
    # (the longest prompts), so long windows are not needed.
    target_seq_len: int = 256
    target_batch: int = 4
    target_steps: int = 1100
    target_lr: float = 3e-3
    # Distillation data: target greedy continuations of train-prompt prefixes,
    # left-truncated to 512 tokens to keep generation and draft steps cheap.
    random_cuts_per_doc: int = 1
    distill_new_tokens: int = 80
    distill_max_prefix: int = 512
    gen_batch: int = 64
    gen_tokens: int = 16384
    # Draft training on the distillation data.
    draft_batch_tokens: int = 4096
    draft_steps: int = 350
    draft_lr: float = 3e-3
    # Evaluation on held-out first turns.
    eval_prompts: int = 48
    eval_new_tokens: int = 64
    eval_k: int = 4
    threads: int = 2


def quick(cfg: RunConfig) -> RunConfig:
    """A ~3 minute smoke/tuning variant of ``cfg`` (weaker models, 16 eval prompts)."""
    return replace(
        cfg,
        target_steps=cfg.target_steps // 4,
        draft_steps=cfg.draft_steps // 4,
        random_cuts_per_doc=0,
        eval_prompts=16,
    )


# --------------------------------------------------------------------------- data


def load_split(path: Path = DATA_PATH) -> tuple[list[str], list[str]]:
    """Return (train documents, held-out first turns).

    Every turn of a train question is its own document; held-out questions are
    never returned as training text.
    """
    train: list[str] = []
    held_out: list[str] = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f):
            turns = json.loads(line)["turns"]
            if i % 5 == 0:
                held_out.append(turns[0])
            else:
                train.extend(turns)
    return train, held_out


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style), so any text round-trips exactly."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=4096,
        # The default cleanup would turn " ." into "." and break round-trips.
        clean_up_tokenization_spaces=False,
    )


def encode(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> list[list[int]]:
    """Token ids without special tokens (the tokenizer adds none anyway)."""
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def packed_batches(
    docs: list[list[int]], eos_id: int, seq_len: int, batch: int, rng: random.Random
) -> Iterator[torch.Tensor]:
    """Endless [batch, seq_len] windows of the EOS-joined train stream.

    Documents are reshuffled and repacked every epoch so window boundaries
    (and thus the contexts seen) differ between epochs.
    """
    while True:
        order = list(range(len(docs)))
        rng.shuffle(order)
        stream = [t for i in order for t in (*docs[i], eos_id)]
        windows = [stream[s : s + seq_len] for s in range(0, len(stream) - seq_len + 1, seq_len)]
        rng.shuffle(windows)
        for b in range(0, len(windows) - batch + 1, batch):
            yield torch.tensor(windows[b : b + batch])


# --------------------------------------------------------------------------- models


def make_model(spec: ModelSpec, tokenizer: PreTrainedTokenizerFast, cfg: RunConfig) -> LlamaForCausalLM:
    """Fresh randomly initialised Llama LM with tied embeddings (saves ~vocab*hidden params)."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        intermediate_size=spec.ffn,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def n_params(model: torch.nn.Module) -> int:
    """Unique parameter count (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def lr_at(step: int, total: int, peak: float) -> float:
    """Linear warmup then cosine decay to 10% of peak."""
    warmup = max(1, total // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_loop(
    model: torch.nn.Module,
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    peak_lr: float,
    desc: str,
) -> float:
    """AdamW on (input_ids, labels) batches; returns the mean loss of the last 10% of steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    tail: list[float] = []
    bar = tqdm(range(steps), desc=desc, mininterval=2.0)
    for step in bar:
        ids, labels = next(batches)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr)
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        if step >= steps - max(1, steps // 10):
            tail.append(loss.item())
    model.eval()
    return sum(tail) / len(tail)


def next_token_labels(ids: torch.Tensor) -> torch.Tensor:
    """Causal-LM labels aligned with logits: position t predicts token t+1."""
    labels = torch.full_like(ids, IGNORE)
    labels[:, :-1] = ids[:, 1:]
    return labels


# --------------------------------------------------------------------------- saving


def save_pair(
    out: Path, tokenizer: PreTrainedTokenizerFast, models_by_name: dict[str, PreTrainedModel]
) -> dict[str, int]:
    """save_pretrained each model in float16 with tokenizer + generation config; returns weight bytes."""
    sizes: dict[str, int] = {}
    for name, model in models_by_name.items():
        path = out / name
        path.mkdir(parents=True, exist_ok=True)
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            do_sample=False,
        )
        # float16 halves the size; its 10-bit mantissa perturbs argmaxes far less than bfloat16.
        model.to(torch.float16).save_pretrained(path, safe_serialization=True)
        model.to(torch.float32)
        tokenizer.save_pretrained(path)
        sizes[name] = (path / "model.safetensors").stat().st_size
    return sizes


def load_pair(out: Path) -> tuple[PreTrainedTokenizerFast, PreTrainedModel, PreTrainedModel]:
    """Load the saved pair the way the app does (float32 from float16 weights)."""
    tok = AutoTokenizer.from_pretrained(out / "default-target")
    target = AutoModelForCausalLM.from_pretrained(out / "default-target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(out / "default-draft", dtype=torch.float32).eval()
    return tok, target, draft


# --------------------------------------------------------------------------- timing and seeds


class Timer:
    """Records wall time per named phase."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.last = self.start
        self.phases: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = round(now - self.last, 1)
        self.last = now
        print(f"[{name}] {self.phases[name]:.1f}s (total {now - self.start:.1f}s)", flush=True)


def seed_all(seed: int) -> None:
    """Seed torch (init, shuffles use their own random.Random)."""
    torch.manual_seed(seed)
    random.seed(seed)
