"""Measure batched-versus-batch-1 logit noise per dtype, the data behind `MARGIN_THRESHOLDS`.

For each model (the embedded default target, the tiny Llama of the tests) and dtype (float32,
bfloat16, float16 on CPU) the batch-1 oracle of `specviz.engine.reference` decodes every prompt
greedily with the model's own cache, keeping each step's logits. The same tokens are then fed
batched the way the engine verifies drafts: prompts left-padded to one batch, prefilled, then
teacher-forced in chunks of `k + 1` tokens with a cache. At every position where the batched
argmax agrees with the batch-1 token ("agreeing positions": where only noise, no flip, shows)
the script records (and, where the argmax flipped, the batch-1 margin there: `max_flip_margin`)

  * max_i |logit_batched[i] - logit_single[i]|  (the largest single-logit error), and
  * |Δ margin| = |(b[t1] - b[t2]) - (s[t1] - s[t2])| for the batch-1 top-1 and top-2 tokens
    t1, t2 (how far noise moves the quantity the verdict compares with the threshold).

A flip against the reference needs |Δ margin| > margin, so the near-tie threshold must sit above
the noise on margins: `MARGIN_THRESHOLDS` takes about 2 × the largest |Δ margin| measured over
both models, rounded up to a 1-2-5 step (docs/forensics.md has the table). A threshold far above
the noise would call any divergence "numerical" whatever its cause (issue 26).

    OMP_NUM_THREADS=1 python -m tools.calibrate_margins [--json out.json]   # from the repository root
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specviz.engine.models import DEFAULT_TARGET, load_causal_lm, load_tokenizer
from specviz.engine.reference import _cache_of, cache_keyword

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TEXTS = [
    "hello world",
    "a",
    "the quick brown fox jumps over the lazy dog",
    "xy",
    "some medium prompt",
    "zz top",
    "1234567890" * 3,
    "q",
    "ragged rows",
    "mixed",
    "speculative decoding in batches",
    "once upon a time there was",
    "the cache",
    "numbers 1 2 3 4",
    "left padding",
    "z",
]


@torch.no_grad()
def single_logits(model, prompt: list[int], new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Batch-1 greedy decoding with the model's cache: (tokens, logits [n, V] in float32)."""
    keyword = cache_keyword(model)
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    tokens, rows = [], []
    for _ in range(new_tokens):
        logits = out.logits[0, -1].float()
        rows.append(logits)
        tokens.append(int(logits.argmax()))
        out = model(input_ids=torch.tensor([[tokens[-1]]]), use_cache=True, **{keyword: _cache_of(out)})
    return tokens, torch.stack(rows)


@torch.no_grad()
def batched_logits(model, prompts: list[list[int]], forced: list[list[int]], pad: int, chunk: int) -> torch.Tensor:
    """Left-padded batch, prefill, then the forced tokens in chunks of `chunk`: logits [B, n, V]."""
    keyword = cache_keyword(model)
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    last = out.logits[:, -1:].float()
    pieces = [last]
    n = len(forced[0])
    done = 0
    while done < n - 1:
        step = min(chunk, n - 1 - done)
        new = torch.tensor([f[done : done + step] for f in forced])
        mask = torch.cat([mask, torch.ones(len(prompts), step, dtype=mask.dtype)], 1)
        pos = mask.cumsum(1)[:, -step:] - 1
        out = model(input_ids=new, attention_mask=mask, position_ids=pos, use_cache=True, **{keyword: _cache_of(out)})
        pieces.append(out.logits.float())
        done += step
    return torch.cat(pieces, 1)


def measure(model, prompts: list[list[int]], pad: int, new_tokens: int, batch: int, chunk: int) -> dict:
    logit_err, margin_err, agree, total, margins, flip_margins = [], [], 0, 0, [], []
    singles = [single_logits(model, p, new_tokens) for p in prompts]
    for lo in range(0, len(prompts), batch):
        group = list(range(lo, min(lo + batch, len(prompts))))
        batched = batched_logits(model, [prompts[i] for i in group], [singles[i][0] for i in group], pad, chunk)
        for b, i in enumerate(group):
            single = singles[i][1]
            for t in range(single.shape[0]):
                s, x = single[t], batched[b, t]
                total += 1
                top2 = s.topk(2)
                t1, t2 = int(top2.indices[0]), int(top2.indices[1])
                margins.append(float(s[t1] - s[t2]))
                if int(x.argmax()) != t1:
                    flip_margins.append(float(s[t1] - s[t2]))
                    continue  # a flip: the noise exceeded the margin there; not an agreeing position
                agree += 1
                logit_err.append(float((x - s).abs().max()))
                margin_err.append(abs(float((x[t1] - x[t2]) - (s[t1] - s[t2]))))
    le, me = torch.tensor(logit_err), torch.tensor(margin_err)
    return {
        "positions": total,
        "agreeing": agree,
        "max_logit_err": round(float(le.max()), 6),
        "p99_logit_err": round(float(le.quantile(0.99)), 6),
        "max_margin_err": round(float(me.max()), 6),
        "p99_margin_err": round(float(me.quantile(0.99)), 6),
        "max_flip_margin": round(max(flip_margins), 6) if flip_margins else None,
        "max_reference_margin": round(max(margins), 6),
    }


def models():
    """(name, loader(dtype) -> (model, prompts, pad)) for the two pairs' targets."""

    def default(dtype):
        tok = load_tokenizer(DEFAULT_TARGET)
        model = load_causal_lm(DEFAULT_TARGET, torch.device("cpu"), dtype)
        prompts = [tok(t)["input_ids"] or [0] for t in TEXTS]
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        return model, prompts, pad

    def tiny(dtype):
        from tests.support.tiny import ToyTokenizer, make_pair

        pair = make_pair("llama")
        tok = ToyTokenizer()
        return pair.target.to(dtype), [tok(t)["input_ids"] for t in TEXTS], pair.pad_token_id

    return [("default-target", default), ("tiny-llama", tiny)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=5, help="tokens per verify forward (draft_k + 1)")
    ap.add_argument("--json", help="write the table here too")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    rows = []
    for name, load in models():
        for dname, dtype in DTYPES.items():
            model, prompts, pad = load(dtype)
            stats = measure(model, prompts, pad, args.new_tokens, args.batch, args.chunk)
            rows.append({"model": name, "dtype": dname, **stats})
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
