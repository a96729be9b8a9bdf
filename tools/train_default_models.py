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

The parts are modules of their own: `train_common.py` (settings, corpus, models, training loop,
saving), `train_distill.py` (the draft's distillation data and the pair's evaluation) and
`train_head.py` (the head); this one runs them.

Usage::

    python -m tools.train_default_models [--out specviz/assets] [--quick]
    python -m tools.train_default_models --head [--out specviz/assets]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from dataclasses import asdict, replace
from pathlib import Path

# Spinning OpenMP workers collapse throughput (3-4x) when the 2 cores are shared
# with other jobs; passive waiting keeps 2 threads useful. Must precede torch import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from tools.train_common import (  # noqa: E402
    REPO_ROOT,
    RunConfig,
    Timer,
    encode,
    load_pair,
    load_split,
    make_model,
    n_params,
    next_token_labels,
    packed_batches,
    quick,
    save_pair,
    seed_all,
    train_loop,
    train_tokenizer,
)
from tools.train_distill import (  # noqa: E402
    build_distill_set,
    distill_batches,
    distill_prefixes,
    greedy_generate,
    mean_loss,
    speculative_acceptance,
    teacher_forced_agreement,
)
from tools.train_head import HeadConfig, run_head  # noqa: E402


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
