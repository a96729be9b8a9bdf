"""Own truth for the dupes engine: batch-1 greedy decoding of the target alone, plain loop,
own DynamicCache, no specviz.watch in this process. Writes truth_dupes.json keyed by n."""

import json
import os

import torch
from common import EOS, HERE, TEXTS, setup
from transformers import DynamicCache

DTEXTS = [TEXTS[0], TEXTS[0], TEXTS[1], TEXTS[1], TEXTS[2], TEXTS[5]]
DBUDGETS = [12, 20, 16, 7, 18, 14]


@torch.no_grad()
def greedy(model, prompt, budget):
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([prompt])
    out = []
    while len(out) < budget:
        t = int(model(input_ids=ids, cache=cache, use_cache=True).logits[0, -1].argmax())
        out.append(t)
        if t == EOS:
            break
        ids = torch.tensor([[t]])
    return out


if __name__ == "__main__":
    pair, tok, _ = setup(1)
    prompts = [tok(t).input_ids for t in DTEXTS]
    table = {}
    for n in (5, 6):
        table[str(n)] = {
            "prompts": prompts[:n],
            "budgets": DBUDGETS[:n],
            "truth": [greedy(pair.target, p, b) for p, b in zip(prompts[:n], DBUDGETS[:n])],
        }
    print([len(p) for p in prompts])
    print(table["6"]["truth"])
    with open(os.path.join(HERE, "truth_dupes.json"), "w") as f:
        json.dump(table, f)
