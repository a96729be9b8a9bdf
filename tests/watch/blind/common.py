"""Shared bits for the blind engines: models, prompts, ground truth (computed in a separate,
unwatched process by truth.py and read from truth.json), and a tiny CLI."""

import argparse
import json
import os

import torch

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
from specviz.engine.models import load_pair  # noqa: E402  (the repository on PYTHONPATH: test_blind_round.py)

TEXTS = [
    "The cat sat on the mat and",
    "Once upon a time, in a small village near the sea, there lived",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog again and again and",
    "In 1905 Albert Einstein published four papers that changed physics forever. The first explained the",
    "The dog sat on the mat but",
]
EOS = 0
PREFIX_TEXT = "You are a helpful assistant. Answer briefly."  # e16_prefix: shared by every prompt


def prefixed(tok, n):
    """(prefix ids, each of the first n texts' ids after it, any BOS dropped): e16_prefix's prompts."""
    pre, bos = tok(PREFIX_TEXT).input_ids, tok.bos_token_id
    sufs = [tok(t).input_ids for t in TEXTS[:n]]
    drop = bos is not None and bos != tok.eos_token_id
    return pre, [s[1:] if drop and s and s[0] == bos else s for s in sufs]


def args(extra=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--bug", default="")
    ap.add_argument("--api", default="", help="trace path: run under specviz.watch (API mode)")
    ap.add_argument("--n", type=int, default=5, help="number of prompts")
    for a, kw in (extra or {}).items():
        ap.add_argument(a, **kw)
    return ap.parse_args()


def setup(n=5, dtype=None):
    pair = load_pair(device="cpu")
    if dtype is not None:
        pair.target.to(dtype)
    tok = pair.tokenizer
    prompts = [tok(t).input_ids for t in TEXTS[:n]]
    return pair, tok, prompts


def budgets_for(n):
    return [16, 20, 24, 18, 22, 21][:n]


def truth_key(prompts, budgets, dtype="float32"):
    return json.dumps([prompts, budgets, dtype])


def load_truth(prompts, budgets, dtype="float32"):
    with open(os.path.join(HERE, "truth.json")) as f:
        table = json.load(f)
    return table[truth_key(prompts, budgets, dtype)]


def report(outs, prompts, budgets, tok, dtype="float32"):
    """Compare with batch-1 greedy truth; decode like a user would (the command reads it)."""
    truth = load_truth(prompts, budgets, dtype)
    ok = all(o == t for o, t in zip(outs, truth))
    for i, o in enumerate(outs):
        text = tok.decode(prompts[i] + o)
        mark = "==" if o == truth[i] else "!="
        print(f"seq {i} {mark} truth: {o}" + ("" if o == truth[i] else f"\n       truth: {truth[i]}"))
        del text
    print("MATCH" if ok else "MISMATCH")
    return ok


class NoWatch:
    """Stands in for specviz.watch when the script runs bare (command mode)."""

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def rows(self, *a, **k):
        pass

    def batch(self, *a, **k):
        pass

    def emit(self, *a, **k):
        pass


def watcher(a, pair, prompts, name, drafter=None, use_draft=True, target=None):
    if not a.api:
        return NoWatch()
    import specviz

    kw = {} if drafter is None else {"drafter": drafter}
    return specviz.watch(
        target or pair.target,
        pair.draft if use_draft else None,
        tokenizer=pair.tokenizer,
        prompts=prompts,
        out=a.api,
        name=name,
        **kw,
    )


def cut(tokens, room):
    """Tokens a sequence may take: up to its remaining budget, through its first EOS."""
    out = []
    for t in tokens[:room]:
        out.append(t)
        if t == EOS:
            break
    return out
