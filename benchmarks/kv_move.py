"""The KV move alone, vs batch size: `moves.compact` (the engine's) against the reference's per-row loop.

Isolates the realignment cost from the models: a cache of the given shape, rows with different
left padding and different accepted counts (ragged), one EQSPEC realignment. Two ways:
- `compact`: `specviz.engine.kv.moves.compact`, each layer viewed as [B*H*W, D] rows and moved with one
  `index_select` of whole head-dim vectors into a new buffer with room for the next forwards
  (`specviz/engine/kv/headroom.py`), the index built once for all layers;
- `loop`: `specviz.engine.kv.moves.compact_per_row_loop`, the reference's Python loop per row and layer.
Both are checked to agree on every attended slot (padding slots hold whatever each reads: masked)
before timing. Median of --repeats, in ms per realignment.

    python benchmarks/kv_move.py --threads 2                     # default-pair-like shapes, CPU
    python benchmarks/kv_move.py --shape vicuna7b --device cuda   # the paper's target on a GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from specviz.bench import provenance
from specviz.engine.kv.moves import compact, compact_per_row_loop
from specviz.engine.kv.state import KVState, cache_layers

# (layers, kv heads, head dim, dtype)
SHAPES = {
    "default": (4, 4, 48, torch.float32),  # about the embedded default target (d=192, 4 layers)
    "vicuna7b": (32, 32, 128, torch.bfloat16),
}


def ragged_state(
    batch: int, width: int, k: int, shape: tuple, device: torch.device, seed: int = 0
) -> tuple[KVState, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A left-padded cache of `width` old slots + k+1 verify slots, each row accepting 0..k drafts."""
    from transformers import DynamicCache

    layers, heads, dim, dtype = shape
    gen = torch.Generator().manual_seed(seed)
    pads = torch.randint(0, width // 2, (batch,), generator=gen)
    accepted = torch.randint(0, k + 1, (batch,), generator=gen)
    full = width + k + 1
    cache = DynamicCache()
    for layer in range(layers):
        keys = torch.randn(batch, heads, full, dim, generator=gen).to(device, dtype)
        cache.update(keys, keys.clone(), layer)
    slots = torch.arange(full)[None, :]
    retain = (slots >= pads[:, None]) & (slots < width + accepted[:, None] + 1)
    mask = (slots >= pads[:, None]).long()  # as fed to the verify pass: every verify slot attended
    next_pos = (width - pads + accepted + 1).to(device)
    state = KVState(cache=cache, mask=mask.to(device), next_pos=next_pos)
    return state, torch.arange(batch, device=device), retain.to(device), retain.to(device), next_pos


def time_move(fn: Callable[..., KVState], args: tuple, device: torch.device, repeats: int) -> float:
    import copy

    times = []
    for _ in range(repeats):
        state = copy.deepcopy(args[0])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        fn(state, *args[1:])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def same_result(args: tuple) -> bool:
    """`compact` and the per-row loop agree on the new mask and on every attended slot."""
    import copy

    a = compact(copy.deepcopy(args[0]), *args[1:])
    b = compact_per_row_loop(copy.deepcopy(args[0]), *args[1:])
    if a.cache is None or b.cache is None:  # no slot left: the loop keeps empty tensors, compact none
        return torch.equal(a.mask, b.mask) and (a.cache is b.cache or a.mask.numel() == 0)
    attended = a.mask.bool()[:, None, :, None]
    layers_a, layers_b = cache_layers(a.cache), cache_layers(b.cache)
    return torch.equal(a.mask, b.mask) and all(
        torch.equal(x.keys * attended, y.keys * attended) and torch.equal(x.values * attended, y.values * attended)
        for x, y in zip(layers_a, layers_b)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32")
    parser.add_argument("--width", type=int, default=256, help="cached slots before the verify window")
    parser.add_argument("--draft-k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    shape = SHAPES[args.shape]
    print(provenance("python benchmarks/kv_move.py " + " ".join(sys.argv[1:] if argv is None else argv)))
    print(f"shape {args.shape} {shape[:3]} {shape[3]}, width {args.width}, k={args.draft_k}, {device}, ms per move")
    print("| batch | compact | loop | agree |")
    print("|---|---|---|---|")
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        case = ragged_state(batch, args.width, args.draft_k, shape, device)
        agree = same_result(case)
        ms = [time_move(fn, case, device, args.repeats) for fn in (compact, compact_per_row_loop)]
        print(f"| {batch} | {ms[0]:.3f} | {ms[1]:.3f} | {agree} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
