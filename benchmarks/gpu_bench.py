"""Throughput and per-step cost of batched speculative decoding on one GPU, at a realistic acceptance, no download.

Self-contained: no network, no tokenizer. The target is a random-weight Llama of Vicuna-7B's shape
(hidden 4096, 32 layers, 32 heads, MLP 11008, vocab 32000) in bfloat16. Random weights alone give
acceptance ~0, so the draft is a *self-draft*: the target's own first N layers (2 by default) with
its embedding, final norm and LM head (shared, not copied), and the residual writes (`o_proj`,
`down_proj`) of the target's other layers are scaled by a factor calibrated before timing so that
greedy acceptance at k = 4 lands in 0.6-0.7 (real FLOPs and bytes, synthetic values). The engine
then decodes random-token prompts of 160-256 tokens with every arm (batched baseline, EQSPEC,
EQSPEC with the per-row loop, EXSPEC, INPLACE) at batch 1, 8 and 32, through `specviz.bench`
(the code of `python -m specviz bench`): arms interleaved, 3 repeats of which the first (cold,
over every shape) is dropped on CUDA, plus tracing on/off pairs (EQSPEC and INPLACE) after them.

    python benchmarks/gpu_bench.py                        # one H200: under 5 minutes
    python benchmarks/gpu_bench.py --tiny                 # the same logic on CPU in seconds
    python benchmarks/gpu_bench.py --out benchmarks/results/gpu-h200.md
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specviz.bench import BenchSettings, Cell, TracingResult, machine_info, run_bench
from specviz.engine.models import ModelPair
from specviz.trace.naming import now_iso


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    mlp: int


@dataclass(frozen=True)
class Shapes:
    target: ModelShape
    draft_layers: int  # the self-draft: the target's first layers
    vocab: int
    prompt_tokens: tuple[int, int]  # prompt lengths drawn uniformly from this range
    max_positions: int


PAPER = Shapes(ModelShape(4096, 32, 32, 11008), 2, 32000, (160, 256), 2048)
TINY = Shapes(ModelShape(128, 4, 4, 256), 2, 512, (12, 40), 512)
ACCEPTANCE = (0.6, 0.7)  # the greedy acceptance at k = 4 the tail scale is calibrated to
SCALE_RANGE = (1e-4, 1.0)  # the bisection's bracket for the tail scale (log space)


class IdTokenizer:
    """Prompts are space-separated token IDs: no vocabulary, no download."""

    pad_token_id = 0
    eos_token_id = None

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [int(t) for t in text.split()]}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(str(i) for i in ids)


def llama(shape: ModelShape, shapes: Shapes, device: torch.device, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=shapes.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.mlp,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=shapes.max_positions,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    with torch.device(device):  # initialise on the device: a 7B random init on the host takes minutes
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def self_draft(target: Any, layers: int) -> Any:
    """The target's first `layers` decoder layers with its embedding, final norm, rotary and LM head,
    shared (no copy): a draft whose hidden states are the target's after `layers` layers."""
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    with torch.device("meta"):  # every module is replaced by the target's below: allocate nothing
        draft = AutoModelForCausalLM.from_config(config, dtype=target.dtype)
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(target.model.layers[:layers])
    draft.model.norm = target.model.norm
    draft.model.rotary_emb = target.model.rotary_emb
    draft.lm_head = target.lm_head
    return draft.eval()


class TailScale:
    """Scales the residual writes (o_proj, down_proj) of the target's layers past the draft's."""

    def __init__(self, target: Any, first: int) -> None:
        self.weights = []
        for layer in target.model.layers[first:]:
            for linear in (layer.self_attn.o_proj, layer.mlp.down_proj):
                self.weights.append((linear.weight, linear.weight.detach().clone()))
        self.scale = 1.0

    @torch.no_grad()
    def set(self, scale: float) -> None:
        for weight, original in self.weights:
            weight.copy_(original * scale)
        self.scale = scale

    def release(self) -> None:
        self.weights = []  # the originals are not needed once calibrated


def random_pair(shapes: Shapes, device: torch.device, dtype: torch.dtype, seed: int = 0) -> tuple[ModelPair, TailScale]:
    torch.manual_seed(seed)
    target = llama(shapes.target, shapes, device, dtype)
    pair = ModelPair(
        target=target,
        draft=self_draft(target, shapes.draft_layers),
        tokenizer=IdTokenizer(),
        target_name=f"random llama {shapes.target.layers}x{shapes.target.hidden}",
        draft_name=f"its first {shapes.draft_layers} layers (self-draft)",
        eos_token_ids=[],  # random weights: no EOS, every row runs to max_new_tokens
        pad_token_id=0,
        device=device,
        dtype=dtype,
    )
    return pair, TailScale(target, shapes.draft_layers)


def measure_acceptance(pair: ModelPair, texts: list[str], draft_k: int, max_new_tokens: int) -> float:
    from specviz.analysis.metrics import acceptance
    from specviz.engine.run import RunConfig, run

    config = RunConfig(
        method="eqspec",
        batch_size=len(texts),
        draft_k=draft_k,
        max_new_tokens=max_new_tokens,
        reference=False,
        kv_check_every=0,
    )
    return acceptance(run(pair, texts, config))[0].rate or 0.0


def calibrate(pair: ModelPair, tail: TailScale, texts: list[str], args: argparse.Namespace) -> tuple[float, float]:
    """Bisect the tail scale (log space) until greedy acceptance at k = 4 is within ACCEPTANCE.

    A smaller scale leaves the target closer to its first layers, so acceptance falls as it grows.
    Returns (scale, acceptance)."""
    import math

    low, high = (math.log(v) for v in SCALE_RANGE)
    best = (1.0, 0.0)
    for _ in range(args.calibration_steps):
        scale = math.exp((low + high) / 2)
        tail.set(scale)
        rate = measure_acceptance(pair, texts, 4, args.calibration_tokens)
        best = min(best, (scale, rate), key=lambda b: abs(b[1] - sum(ACCEPTANCE) / 2))
        if ACCEPTANCE[0] <= rate <= ACCEPTANCE[1]:
            return scale, rate
        if rate > ACCEPTANCE[1]:
            low = math.log(scale)  # too similar: scale the tail up
        else:
            high = math.log(scale)
    tail.set(best[0])
    return best


def random_prompts(shapes: Shapes, count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    low, high = shapes.prompt_tokens
    return [" ".join(str(rng.randrange(3, shapes.vocab)) for _ in range(rng.randint(low, high))) for _ in range(count)]


def settings_for(batch_size: int, args: argparse.Namespace, tracing: bool) -> BenchSettings:
    return BenchSettings(
        arms=ARMS,
        batch_sizes=(batch_size,),
        draft_ks=(args.draft_k,),
        num_prompts=max(batch_size, args.min_prompts),
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        tracing_repeats=args.tracing_repeats if tracing else 0,
        check=False,
    )


ARMS = ("baseline", "eqspec", "eqspec-loop", "exspec", "inplace")


def run_all(pair: ModelPair, args: argparse.Namespace) -> tuple[list[Cell], list[TracingResult]]:
    """One bench per batch size (each with as many prompts as the batch, so batch 1 stays short)."""
    texts = random_prompts(args.shapes, max(max(args.batch_sizes), args.min_prompts), args.seed)
    tracing_batch = args.tracing_batch if args.tracing_batch in args.batch_sizes else max(args.batch_sizes)
    cells: list[Cell] = []
    tracing: list[TracingResult] = []
    for batch_size in args.batch_sizes:
        result = run_bench(pair, texts, settings_for(batch_size, args, batch_size == tracing_batch), "gpu_bench")
        cells += result.cells
        tracing += result.tracing_by_arm.values()
    return cells, tracing


def table(cells: list[Cell]) -> str:
    head = ("arm", "batch", "tok/s", "speedup", "acc rate", "step ms", "draft ms", "verify ms", "align ms", "align %")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        rate = "-" if c.acceptance_rate is None else f"{c.acceptance_rate:.2f}"
        lines.append(
            f"| {c.arm} | {c.batch_size} | {c.tokens_per_second:.1f} | {c.speedup_vs_baseline:.2f}x | {rate} | "
            f"{c.step_ms:.2f} | {c.draft_ms_per_step:.2f} | {c.verify_ms_per_step:.2f} | {c.align_ms_per_step:.2f} | "
            f"{c.alignment_share:.1%} |"
        )
    return "\n".join(lines)


def report(cells: list[Cell], tracing: list[TracingResult], machine: dict[str, Any], args: argparse.Namespace) -> str:
    shapes = "tiny (CPU smoke test)" if args.tiny else "Vicuna-7B-shaped target"
    warm = "first repeat (cold, every shape) dropped" if machine["device"].startswith("cuda") else "small warm-up run"
    lines = [
        "# gpu_bench: throughput at a calibrated acceptance, random weights",
        "",
        f"- date: {now_iso()}",
        f"- command: `python benchmarks/gpu_bench.py {' '.join(args.argv)}`",
        f"- device: {machine.get('device_name', machine['device'])}, {machine['dtype']}, torch {machine['torch']}, "
        f"transformers {machine['transformers']}",
        f"- pair: {shapes}, self-draft of its first {args.shapes.draft_layers} layers; tail residual scale "
        f"{args.scale:.4g} calibrated to greedy acceptance {args.calibrated_acceptance:.3f} at k=4 "
        f"(goal {ACCEPTANCE[0]}-{ACCEPTANCE[1]})",
        f"- prompts {args.shapes.prompt_tokens[0]}-{args.shapes.prompt_tokens[1]} random tokens, "
        f"{args.max_new_tokens} new tokens, k={args.draft_k}; {args.repeats} repeats, arms interleaved, warm ({warm})",
        f"- wall time: {args.wall_seconds:.0f} s (calibration {args.calibration_seconds:.0f} s)",
        "",
        table(cells),
        "",
    ]
    for t in tracing:
        lines.append(
            f"- tracing overhead {t.arm}, batch {t.batch_size}, {len(t.seconds_on)} interleaved pairs (warm): "
            f"{t.overhead:.1%} of decode wall time (median on/off - 1); timed inside the recorder-on runs: "
            + ("n/a" if t.overhead_inside is None else f"{t.overhead_inside:.1%}")
            + " (recording and the KV-content check over the rest of decode)"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes, float32, CPU unless --device says otherwise")
    parser.add_argument("--device", default=None, help="default: cuda (cpu with --tiny)")
    parser.add_argument("--batch-sizes", default=None, help="default 1,8,32 (1,2,4 with --tiny)")
    parser.add_argument("--draft-k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 32 (6 with --tiny)")
    parser.add_argument("--repeats", type=int, default=3, help="on CUDA the first is dropped (cold)")
    parser.add_argument("--tracing-repeats", type=int, default=3)
    parser.add_argument("--tracing-batch", type=int, default=8)
    parser.add_argument("--min-prompts", type=int, default=4, help="prompts per bench at least (batch 1 uses 4)")
    parser.add_argument("--calibration-steps", type=int, default=10, help="bisection steps for the tail scale")
    parser.add_argument("--calibration-tokens", type=int, default=None, help="default 24 (6 with --tiny)")
    parser.add_argument("--calibration-prompts", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", default=None, help="also write the report (markdown) here")
    args = parser.parse_args(argv)
    args.argv = argv
    args.shapes = TINY if args.tiny else PAPER
    default_batches = "1,2,4" if args.tiny else "1,8,32"
    args.batch_sizes = [int(b) for b in (args.batch_sizes or default_batches).split(",")]
    args.max_new_tokens = args.max_new_tokens or (6 if args.tiny else 32)
    args.calibration_tokens = args.calibration_tokens or (6 if args.tiny else 24)
    args.device = args.device or ("cpu" if args.tiny else "cuda")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_bench: no CUDA device; use --tiny for the CPU smoke test", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    started = time.perf_counter()
    pair, tail = random_pair(args.shapes, device, dtype, args.seed)
    calibration_texts = random_prompts(args.shapes, args.calibration_prompts, args.seed + 1)
    calibrating = time.perf_counter()
    args.scale, args.calibrated_acceptance = calibrate(pair, tail, calibration_texts, args)
    args.calibration_seconds = time.perf_counter() - calibrating
    tail.release()
    print(f"gpu_bench: tail scale {args.scale:.4g}, acceptance {args.calibrated_acceptance:.3f}", file=sys.stderr)
    machine = machine_info(pair)
    cells, tracing = run_all(pair, args)
    args.wall_seconds = time.perf_counter() - started
    text = report(cells, tracing, machine, args)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
