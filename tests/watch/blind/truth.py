"""Ground truth: batch-1 greedy decoding of the target alone, plain loop, own DynamicCache,
no watch anywhere in this process. Writes truth.json for fp32 and bf16 targets."""

import json
import os

import torch
from common import EOS, HERE, TEXTS, budgets_for, prefixed, setup, truth_key
from transformers import DynamicCache


@torch.no_grad()
def greedy(model, prompt, budget):
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([prompt])
    out = []
    while len(out) < budget:
        logits = model(input_ids=ids, cache=cache, use_cache=True).logits
        t = int(logits[0, -1].argmax())
        out.append(t)
        if t == EOS:
            break
        ids = torch.tensor([[t]])
    return out


table = {}
for dtype in ("float32", "bfloat16"):
    pair, tok, prompts = setup(len(TEXTS), None if dtype == "float32" else torch.bfloat16)
    for n in (4, 5, 6):
        ps, bs = prompts[:n], budgets_for(n)
        table[truth_key(ps, bs, dtype)] = [greedy(pair.target, p, b) for p, b in zip(ps, bs)]
        pre, sufs = prefixed(tok, n)  # e16_prefix's prompts: one system prefix before each text
        ps = [pre + s for s in sufs]
        table[truth_key(ps, bs, dtype)] = [greedy(pair.target, p, b) for p, b in zip(ps, bs)]
    print(dtype, [len(p) for p in prompts], table[truth_key(prompts[:6], budgets_for(6), dtype)])
with open(os.path.join(HERE, "truth.json"), "w") as f:
    json.dump(table, f)
