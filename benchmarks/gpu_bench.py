"""Per-step cost of batched speculative decoding on one GPU, with random-weight models of the paper's shapes.

Self-contained: no download, no network, no tokenizer. A Vicuna-7B-shaped Llama target (hidden 4096,
32 layers, 32 heads, MLP 11008, vocab 32000) and a vicuna-68m-shaped draft (hidden 768, 2 layers,
12 heads, MLP 3072) are built from configs with random weights in bfloat16, and the specviz engine
decodes random-token prompts of 160-256 tokens with EQSPEC (batched KV move), EQSPEC with the
reference's per-row loop, and EXSPEC, at batch 1, 8, 16 and 32. Per step it reports draft, verify,
alignment and bookkeeping time (ms) and their shares, plus tracing overhead (recorder on vs off,
interleaved). Everything is measured by `specviz.bench` (same code as `python -m specviz bench`).

Random weights mean the draft almost never agrees with the target (acceptance ~0): tokens/s and
speedups are meaningless here, but the per-step costs are not, because the KV move copies every
row's cache whatever each row accepted (the batched gather) or loops over every row and layer (the
per-row loop). Reference numbers (one H200, HF eager): a 6-token verify forward
29-46 ms; per-row-loop realignment 31 ms at batch 8 and 113 ms at batch 32; one batched gather
2.4 ms and 8.0 ms.

    python benchmarks/gpu_bench.py                       # H200: about 3-4 minutes
    python benchmarks/gpu_bench.py --tiny                 # CPU smoke test of the same code, seconds
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
    draft: ModelShape
    vocab: int
    prompt_tokens: tuple[int, int]  # prompt lengths drawn uniformly from this range
    max_positions: int


PAPER = Shapes(ModelShape(4096, 32, 32, 11008), ModelShape(768, 2, 12, 3072), 32000, (160, 256), 2048)
TINY = Shapes(ModelShape(128, 4, 4, 256), ModelShape(64, 2, 4, 128), 512, (12, 40), 512)


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


def random_pair(shapes: Shapes, device: torch.device, dtype: torch.dtype, seed: int = 0) -> ModelPair:
    torch.manual_seed(seed)
    target, draft = shapes.target, shapes.draft
    return ModelPair(
        target=llama(target, shapes, device, dtype),
        draft=llama(draft, shapes, device, dtype),
        tokenizer=IdTokenizer(),
        target_name=f"random llama {target.layers}x{target.hidden}",
        draft_name=f"random llama {draft.layers}x{draft.hidden}",
        eos_token_ids=[],  # random weights: no EOS, every row runs to max_new_tokens
        pad_token_id=0,
        device=device,
        dtype=dtype,
    )


def random_prompts(shapes: Shapes, count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    low, high = shapes.prompt_tokens
    return [" ".join(str(rng.randrange(3, shapes.vocab)) for _ in range(rng.randint(low, high))) for _ in range(count)]


def settings_for(batch_size: int, args: argparse.Namespace, tracing: bool) -> BenchSettings:
    return BenchSettings(
        arms=("baseline", "eqspec", "eqspec-loop", "exspec"),
        batch_sizes=(batch_size,),
        draft_ks=(args.draft_k,),
        num_prompts=max(batch_size, args.min_prompts),
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        tracing_repeats=args.tracing_repeats if tracing else 0,
        check=False,
    )


def run_all(pair: ModelPair, args: argparse.Namespace) -> tuple[list[Cell], TracingResult | None]:
    """One bench per batch size (each with as many prompts as the batch, so batch 1 stays short)."""
    texts = random_prompts(args.shapes, max(max(args.batch_sizes), args.min_prompts), args.seed)
    tracing_batch = args.tracing_batch if args.tracing_batch in args.batch_sizes else max(args.batch_sizes)
    cells: list[Cell] = []
    tracing = None
    for batch_size in args.batch_sizes:
        result = run_bench(pair, texts, settings_for(batch_size, args, batch_size == tracing_batch), "gpu_bench")
        cells += result.cells
        tracing = result.tracing or tracing
    return cells, tracing


PHASE_COLUMNS = ("draft", "verify", "align", "bookkeeping")


def table(cells: list[Cell]) -> str:
    head = ("arm", "batch", "step ms", *(f"{p} ms" for p in PHASE_COLUMNS), "align %", "bookkeeping %", "exact")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        if c.arm == "baseline":
            continue
        ms = [getattr(c, f"{p}_ms_per_step") for p in PHASE_COLUMNS]
        lines.append(
            f"| {c.arm} | {c.batch_size} | {c.step_ms:.2f} | "
            + " | ".join(f"{v:.2f}" for v in ms)
            + f" | {c.alignment_share:.1%} | {c.bookkeeping_share:.1%} | {c.exact_match:.3f} |"
        )
    return "\n".join(lines)


def report(cells: list[Cell], tracing: TracingResult | None, machine: dict[str, Any], args: argparse.Namespace) -> str:
    shapes = "tiny (CPU smoke test)" if args.tiny else "paper (Vicuna-7B-shaped target, 68M-shaped draft)"
    lines = [
        "# gpu_bench: per-step cost with random-weight models",
        "",
        f"- date: {now_iso()}",
        f"- command: `python benchmarks/gpu_bench.py {' '.join(args.argv)}`",
        f"- device: {machine.get('device_name', machine['device'])}, {machine['dtype']}, torch {machine['torch']}, "
        f"transformers {machine['transformers']}",
        f"- shapes: {shapes}; prompts {args.shapes.prompt_tokens[0]}-{args.shapes.prompt_tokens[1]} random tokens, "
        f"{args.max_new_tokens} new tokens, k={args.draft_k}, {args.repeats} repeats (medians)",
        "- random weights: acceptance ~0, so throughput means nothing here; the per-step costs do",
        f"- wall time: {args.wall_seconds:.0f} s",
        "",
        table(cells),
        "",
    ]
    if tracing is not None:
        lines.append(
            f"Tracing overhead ({tracing.arm}, batch {tracing.batch_size}, {len(tracing.seconds_on)} interleaved "
            f"pairs): {tracing.overhead:.1%} of decode wall time"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes, float32, CPU unless --device says otherwise")
    parser.add_argument("--device", default=None, help="default: cuda (cpu with --tiny)")
    parser.add_argument("--batch-sizes", default=None, help="default 1,8,16,32 (1,2,4 with --tiny)")
    parser.add_argument("--draft-k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 32 (6 with --tiny)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tracing-repeats", type=int, default=3)
    parser.add_argument("--tracing-batch", type=int, default=8)
    parser.add_argument("--min-prompts", type=int, default=4, help="prompts per bench at least (batch 1 uses 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", default=None, help="also write the report (markdown) here")
    args = parser.parse_args(argv)
    args.argv = argv
    args.shapes = TINY if args.tiny else PAPER
    default_batches = "1,2,4" if args.tiny else "1,8,16,32"
    args.batch_sizes = [int(b) for b in (args.batch_sizes or default_batches).split(",")]
    args.max_new_tokens = args.max_new_tokens or (6 if args.tiny else 32)
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
    pair = random_pair(args.shapes, device, dtype, args.seed)
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
