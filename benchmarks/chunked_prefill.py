"""Cost of chunked prefill against whole-prompt prefill, on the embedded default pair.

Arms (same prompts, same batch, the target's and the draft's prefill of one left-padded batch, as
EQSPEC prefills it): `whole` (one forward per model) and `chunk N` (N columns per forward). The
arms are interleaved within each repeat, after one warm-up call of each, so machine load and
caches hit them alike; the report is each arm's median seconds over `--repeats` and its ratio to
`whole` within the same run. Chunked prefill trades forwards (width / N per model) for smaller
activations; on a CPU that shows as the per-forward overhead. The caches it leaves are checked to
match whole prefill's (mask, positions, and the last token's next-token choice).

    python benchmarks/chunked_prefill.py --num-prompts 16 --batch-size 8 --chunks 16,64 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specviz.data import load_specbench
from specviz.engine.batch import SeqState
from specviz.engine.context import EngineConfig
from specviz.engine.kv.state import feed
from specviz.engine.models import load_pair
from specviz.engine.step import Engine


def engine_for(pair: object, chunk: int) -> Engine:
    return Engine(
        EngineConfig(
            target=pair.target,
            draft=pair.draft,
            k=4,
            max_new_tokens=1,
            eos_ids=frozenset(pair.eos_token_ids),
            pad_id=pair.pad_token_id,
            device=pair.device,
            prefill_chunk=chunk,
        )
    )


def prefill_seconds(engine: Engine, seqs: list[SeqState]) -> tuple[float, object]:
    """Seconds for the target's and the draft's prefill of the batch; the target's state."""
    started = time.perf_counter()
    target = engine.prefill(engine.target, seqs)
    engine.prefill(engine.draft, seqs)
    return time.perf_counter() - started, target


def next_choice(engine: Engine, state: object, seqs: list[SeqState]) -> list[int]:
    """The target's choice after each row's pending token, read from the prefilled cache."""
    pending = torch.tensor([[s.pending] for s in seqs], device=engine.device)
    logits = feed(engine.target, state, pending, state.next_pos[:, None])
    return logits[:, -1].argmax(-1).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--chunks", default="16,64", help="comma list of chunk sizes N (0 is the whole arm)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = load_pair(device="cpu")
    prompts = load_specbench("heldout")[: args.num_prompts]
    ids = [pair.tokenizer(p)["input_ids"] for p in prompts]
    batches = [ids[i : i + args.batch_size] for i in range(0, len(ids), args.batch_size)]
    arms = {"whole": 0} | {f"chunk {n}": int(n) for n in args.chunks.split(",")}
    engines = {name: engine_for(pair, n) for name, n in arms.items()}
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    with torch.no_grad():
        for name, engine in engines.items():  # warm-up, and the caches must agree
            seqs = [SeqState(seq_id=i, prompt_ids=p) for i, p in enumerate(batches[0])]
            _, state = prefill_seconds(engine, seqs)
            choice = next_choice(engine, state, seqs)
            if name == "whole":
                reference = choice
            elif choice != reference:
                raise SystemExit(f"{name}: the prefilled cache predicts {choice}, whole prefill {reference}")
        for _ in range(args.repeats):
            for name, engine in engines.items():  # interleaved: each repeat runs every arm once
                total = 0.0
                for batch in batches:
                    seqs = [SeqState(seq_id=i, prompt_ids=p) for i, p in enumerate(batch)]
                    spent, _ = prefill_seconds(engine, seqs)
                    total += spent
                seconds[name].append(total)
    widths = [max(len(p) for p in b) - 1 for b in batches]
    print(f"prompts {len(ids)}, batch {args.batch_size}, batch widths {widths}, repeats {args.repeats}")
    whole = statistics.median(seconds["whole"])
    print("| arm | forwards per model | median s | ratio to whole |")
    print("|---|---|---|---|")
    for name, n in arms.items():
        forwards = sum(-(-w // n) if n else 1 for w in widths)
        median = statistics.median(seconds[name])
        print(f"| {name} | {forwards} | {median:.3f} | {median / whole:.2f} |")


if __name__ == "__main__":
    main()
