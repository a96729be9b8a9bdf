"""Train specviz's embedded default target/draft model pair from scratch.

Reproduces ``specviz/assets/default-target`` and ``specviz/assets/default-draft``:
a byte-level BPE tokenizer, a small Llama-style target LM, and a smaller draft LM
distilled from the target, all trained only on the SpecBench train split
(question line index ``i % 5 != 0``). Held-out questions (``i % 5 == 0``) are used
only for evaluation. Deterministic (bit-identical reruns); about 8 minutes on 2
lightly shared CPU cores, budgeted to stay under 15 under contention.

With ``--head`` it trains only the EAGLE-style draft head for the saved target
(``specviz/assets/default-head``: fed the target's last hidden state and the next
token's embedding, it predicts the next hidden state; see
``specviz/engine/proposers/head.py``), leaving the pair untouched, and reports the
head's acceptance against the draft model's with specviz's own engine on held-out
prompts. A few minutes on 2 shared CPU cores.

Usage::

    python -m tools.train_default_models [--out specviz/assets] [--quick]
    python -m tools.train_default_models --head [--out specviz/assets]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

# Spinning OpenMP workers collapse throughput (3-4x) when the 2 cores are shared
# with other jobs; passive waiting keeps 2 threads useful. Must precede torch import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from tqdm import tqdm  # noqa: E402
from transformers import (  # noqa: E402
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


# --------------------------------------------------------------------------- distillation


@torch.no_grad()
def greedy_generate(model: PreTrainedModel, ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy-decode ``n`` tokens after equal-length prompts ``ids`` [B, T] with a KV cache.

    Returns (generated [B, n], argmax predictions at every prompt position [B, T]).
    EOS is not special: decoding always runs ``n`` steps.
    """
    out = model(input_ids=ids, use_cache=True)
    prompt_preds = out.logits.argmax(-1)
    token = prompt_preds[:, -1:]
    generated = [token]
    for _ in range(n - 1):
        out = model(input_ids=token, cache=out.cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        generated.append(token)
    return torch.cat(generated, dim=1), prompt_preds


def distill_prefixes(docs: list[list[int]], cfg: RunConfig, rng: random.Random) -> list[list[int]]:
    """Prompt-like prefixes of train documents.

    Whole documents mimic how the app prompts the target (a full question);
    random cuts add continuations that start mid-text for variety.
    """
    prefixes = [d for d in docs if d]
    for d in docs:
        for _ in range(cfg.random_cuts_per_doc):
            if len(d) > 2:
                prefixes.append(d[: rng.randint(1, len(d) - 1)])
    return [p[-cfg.distill_max_prefix :] for p in prefixes]


def length_groups(lengths: list[int], budget: int, max_batch: int) -> list[list[int]]:
    """Indices sorted by length, grouped so that size x longest <= budget tokens.

    Similar lengths keep padding/truncation waste low; the token budget keeps
    long-prompt batches (and their KV caches) small.
    """
    groups: list[list[int]] = [[]]
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        group = groups[-1]
        if group and (len(group) >= max_batch or lengths[i] * (len(group) + 1) > budget):
            groups.append([])
        groups[-1].append(i)
    return groups


@torch.no_grad()
def build_distill_set(
    target: PreTrainedModel, prefixes: list[list[int]], cfg: RunConfig
) -> list[tuple[list[int], list[int]]]:
    """(tokens, labels) pairs labelled with the target's greedy (argmax) choices.

    tokens = prefix + target greedy continuation; labels at every position are
    the target's argmax there, so the draft learns exactly what it must predict
    to be accepted. Each group is left-truncated to its shortest prefix so a
    batch needs no padding or attention mask.
    """
    lengths = [len(p) + cfg.distill_new_tokens for p in prefixes]
    pairs: list[tuple[list[int], list[int]]] = []
    for group in tqdm(length_groups(lengths, cfg.gen_tokens, cfg.gen_batch), desc="distill-gen", mininterval=2.0):
        width = min(len(prefixes[i]) for i in group)
        ids = torch.tensor([prefixes[i][-width:] for i in group])
        gen, prompt_preds = greedy_generate(target, ids, cfg.distill_new_tokens)
        # The prediction after the last generated token is unknown; drop it.
        tokens = torch.cat([ids, gen], dim=1)[:, :-1]
        labels = torch.cat([prompt_preds, gen[:, 1:]], dim=1)
        pairs.extend(zip(tokens.tolist(), labels.tolist(), strict=True))
    return pairs


def distill_batches(
    pairs: list[tuple[list[int], list[int]]], pad_id: int, budget: int, rng: random.Random
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless right-padded batches of similar-length pairs, ~``budget`` tokens each.

    Right padding needs no attention mask: causal attention never lets real
    positions see later pad positions, and pad labels are ignored.
    """
    groups = length_groups([len(t) for t, _ in pairs], budget, max_batch=budget)
    while True:
        rng.shuffle(groups)
        for group in groups:
            width = max(len(pairs[i][0]) for i in group)
            ids = torch.tensor([pairs[i][0] + [pad_id] * (width - len(pairs[i][0])) for i in group])
            labels = torch.tensor([pairs[i][1] + [IGNORE] * (width - len(pairs[i][1])) for i in group])
            yield ids, labels


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def speculative_acceptance(
    target: PreTrainedModel, draft: PreTrainedModel, prompts: list[list[int]], k: int, new_tokens: int
) -> tuple[float, list[list[int]]]:
    """Batch-1 greedy speculative decoding; returns (accepted/drafted, outputs).

    Each step the draft greedily proposes ``k`` tokens; one full (uncached)
    target forward over context+proposal gives the target's greedy prediction
    at each proposal position. The longest matching prefix is accepted and the
    target's own next token is appended, so outputs equal plain target greedy.
    """
    accepted = drafted = 0
    outputs: list[list[int]] = []
    for prompt in tqdm(prompts, desc="spec-eval", mininterval=2.0):
        seq = torch.tensor([prompt])
        while seq.shape[1] - len(prompt) < new_tokens:
            proposal, _ = greedy_generate(draft, seq, k)
            preds = target(input_ids=torch.cat([seq, proposal], dim=1)).logits[0, seq.shape[1] - 1 :].argmax(-1)
            n = 0
            while n < k and proposal[0, n] == preds[n]:
                n += 1
            accepted += n
            drafted += k
            seq = torch.cat([seq, proposal[:, :n], preds[n].view(1, 1)], dim=1)
        outputs.append(seq[0, len(prompt) : len(prompt) + new_tokens].tolist())
    return accepted / drafted, outputs


@torch.no_grad()
def teacher_forced_agreement(target: PreTrainedModel, draft: PreTrainedModel, seqs: list[list[int]]) -> float:
    """Fraction of positions where draft argmax == target argmax on given sequences."""
    same = total = 0
    for s in seqs:
        ids = torch.tensor([s])
        same += int((target(input_ids=ids).logits.argmax(-1) == draft(input_ids=ids).logits.argmax(-1)).sum())
        total += len(s)
    return same / total


@torch.no_grad()
def mean_loss(model: PreTrainedModel, seqs: list[list[int]]) -> float:
    """Token-weighted next-token cross-entropy on real text."""
    total = count = 0.0
    for s in seqs:
        ids = torch.tensor([s])
        logits = model(input_ids=ids).logits[0, :-1]
        total += float(F.cross_entropy(logits, ids[0, 1:], reduction="sum"))
        count += len(s) - 1
    return total / count


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


# --------------------------------------------------------------------------- main


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


def run(cfg: RunConfig, out: Path) -> dict[str, object]:
    """Train, save, reload and evaluate; returns the report dict."""
    torch.set_num_threads(cfg.threads)
    seed_all(cfg.seed)
    rng = random.Random(cfg.seed)
    timer = Timer()

    train_texts, held_out = load_split()
    tokenizer = train_tokenizer(train_texts, cfg.vocab_size)
    for text in held_out:  # byte-level BPE must round-trip unseen text exactly
        assert tokenizer.decode(encode(tokenizer, [text])[0]) == text
    docs = encode(tokenizer, train_texts)
    timer.lap("tokenizer")

    target = make_model(cfg.target, tokenizer, cfg)
    eos = tokenizer.eos_token_id
    windows = packed_batches(docs, eos, cfg.target_seq_len, cfg.target_batch, rng)
    target_loss = train_loop(
        target, ((w, next_token_labels(w)) for w in windows), cfg.target_steps, cfg.target_lr, "target"
    )
    timer.lap("target_train")

    pairs = build_distill_set(target, distill_prefixes(docs, cfg, rng), cfg)
    timer.lap("distill_gen")

    draft = make_model(cfg.draft, tokenizer, cfg)
    batches = distill_batches(pairs, tokenizer.pad_token_id, cfg.draft_batch_tokens, rng)
    draft_loss = train_loop(draft, batches, cfg.draft_steps, cfg.draft_lr, "draft")
    timer.lap("draft_train")

    sizes = save_pair(out, tokenizer, {"default-target": target, "default-draft": draft})
    tokenizer, target, draft = load_pair(out)
    timer.lap("save_reload")

    # Every other held-out prompt: 48 prompts spread evenly over all categories.
    step = max(1, len(held_out) // cfg.eval_prompts)
    prompts = encode(tokenizer, held_out[::step][: cfg.eval_prompts])
    rate, outputs = speculative_acceptance(target, draft, prompts, cfg.eval_k, cfg.eval_new_tokens)
    plain = [greedy_generate(target, torch.tensor([p]), cfg.eval_new_tokens)[0][0].tolist() for p in prompts]
    report: dict[str, object] = {
        "acceptance_rate_k4": round(rate, 4),
        "spec_matches_plain_greedy": sum(a == b for a, b in zip(outputs, plain, strict=True)) / len(plain),
        "agreement_heldout_prompts": round(teacher_forced_agreement(target, draft, prompts), 4),
        "agreement_heldout_continuations": round(
            teacher_forced_agreement(target, draft, [p + o for p, o in zip(prompts, outputs, strict=True)]), 4
        ),
        # The eval ignores EOS (fixed 64 tokens); the app stops at EOS, so report how soon it comes.
        "eos_first_token_fraction": round(sum(o[0] == eos for o in outputs) / len(outputs), 4),
        "mean_tokens_before_eos": round(sum(o.index(eos) if eos in o else len(o) for o in outputs) / len(outputs), 1),
        "target_train_loss": round(target_loss, 4),
        "draft_distill_loss": round(draft_loss, 4),
        "target_heldout_loss": round(mean_loss(target, prompts), 4),
        "draft_heldout_loss": round(mean_loss(draft, prompts), 4),
        "target_params": n_params(target),
        "draft_params": n_params(draft),
        "weight_bytes": sizes,
        "distill_pairs": len(pairs),
        "distill_tokens": sum(len(t) for t, _ in pairs),
        "config": asdict(cfg),
    }
    timer.lap("eval")
    report["timings_s"] = {**timer.phases, "total": round(time.perf_counter() - timer.start, 1)}

    for i in (0, len(prompts) // 2, 2 * len(prompts) // 3):  # writing, qa, math_reasoning
        print(f"\n--- prompt: {tokenizer.decode(prompts[i])[-160:]!r}\n+++ target: {tokenizer.decode(outputs[i])!r}")
    print(json.dumps(report, indent=2))
    return report


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


def main() -> None:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "specviz" / "assets")
    parser.add_argument("--quick", action="store_true", help="short tuning run (~3 min)")
    parser.add_argument("--head", action="store_true", help="train only the draft head for the saved target")
    args = parser.parse_args()
    if args.head:
        cfg_head = HeadConfig()
        run_head(replace(cfg_head, steps=cfg_head.steps // 4) if args.quick else cfg_head, args.out)
        return
    cfg = RunConfig()
    run(quick(cfg) if args.quick else cfg, args.out)


if __name__ == "__main__":
    main()
