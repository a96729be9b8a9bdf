"""Engine H4 (floatmask): a bf16 target verifies, an fp32 draft model proposes K=3, one left-padded
batch; every forward gets an ADDITIVE float 4-D mask [B, 1, Q, cache + Q] built here (0 where
attended, finfo(dtype).min where not). After each step both caches are cropped back to the shortest
active row's committed length (DynamicCache.crop), so the next query re-feeds each longer row's
extra committed tokens: ragged, right-padded, the padding masked out (a padded query slot attends
nothing). Finished rows stay in the batch, fed padding that attends nothing.

Bugs: --bug peek  : the verify block's causal part is off by one (query slot i also sees slot i+1)
      --bug nopad : positions count the left padding (physical column instead of logical index)
"""

import os
import sys

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from transformers import DynamicCache

K = 3
PAD = 1


class Batch:
    def __init__(self, prompts, bug):
        self.bug = bug
        self.P = max(len(p) for p in prompts)
        self.pads = [self.P - len(p) for p in prompts]

    def pos(self, r, col):
        """Position of row r's token in physical column col (the logical index)."""
        if self.bug == "nopad":
            return col
        return max(col - self.pads[r], 0)


def add_mask(allowed, dtype):
    """Bool [B, Q, W] -> additive float [B, 1, Q, W]."""
    m = torch.zeros(allowed.shape, dtype=dtype)
    m.masked_fill_(~allowed, torch.finfo(dtype).min)
    return m[:, None]


def forward(model, cache, bt, width, feeds, starts, peek=False):
    """One ragged forward over `cache` (physical width `width`): row r feeds feeds[r] (maybe []) into
    columns width.., attending its own committed columns pads[r]..starts[r]-1 of the cache (a row's
    valid cache columns end at starts[r] <= width; columns starts[r]..width-1 are holes), then its
    own query causally. Returns the logits [B, Q, V] and Q."""
    B = len(feeds)
    Q = max(1, max(len(f) for f in feeds))
    dtype = model.dtype
    ids = torch.full((B, Q), PAD, dtype=torch.long)
    pos = torch.zeros((B, Q), dtype=torch.long)
    allowed = torch.zeros((B, Q, width + Q), dtype=torch.bool)
    for r, f in enumerate(feeds):
        n = len(f)
        if n == 0:
            continue
        ids[r, :n] = torch.tensor(f)
        allowed[r, :n, bt.pads[r] : starts[r]] = True
        logical0 = starts[r] - bt.pads[r]  # the logical index of the row's first fed token
        for i in range(n):
            # position: logical index; with the nopad bug, the physical column it would occupy
            # if the row's tokens were contiguous from the left edge
            pos[r, i] = bt.pos(r, bt.pads[r] + logical0 + i)
            hi = min(i + 1 + (1 if peek else 0), n)
            allowed[r, i, width : width + hi] = True
    logits = model(
        input_ids=ids,
        attention_mask=add_mask(allowed, dtype),
        position_ids=pos,
        cache=cache,
        use_cache=True,
    ).logits
    return logits, Q


def crop(cache, width):
    """Keep the first `width` columns (this transformers' crop takes the count to remove, negative)."""
    extra = cache.get_seq_length() - width
    if extra > 0:
        cache.crop(-extra)


def main():
    a = args()
    pair, tok, prompts = setup(a.n, torch.bfloat16)
    budgets = budgets_for(a.n)
    target, draft = pair.target, pair.draft
    B = len(prompts)
    bt = Batch(prompts, a.bug)
    ctx = [list(p) for p in prompts]
    outs = [[] for _ in prompts]
    done = [False] * B
    with torch.no_grad(), watcher(a, pair, prompts, "probe-floatmask") as w:
        tc = DynamicCache(config=target.config)
        dc = DynamicCache(config=draft.config)
        # prefill: every prompt but its last token, left-padded to P - 1 columns
        pre = [[PAD] * bt.pads[r] + ctx[r][:-1] for r in range(B)]
        for model, cache in ((target, tc), (draft, dc)):
            ids = torch.tensor(pre)
            Wp = bt.P - 1
            allowed = torch.zeros((B, Wp, Wp), dtype=torch.bool)
            pos = torch.zeros((B, Wp), dtype=torch.long)
            for r in range(B):
                for i in range(bt.pads[r], Wp):
                    allowed[r, i, bt.pads[r] : i + 1] = True
                    pos[r, i] = bt.pos(r, i)
            model(
                input_ids=ids,
                attention_mask=add_mask(allowed, model.dtype),
                position_ids=pos,
                cache=cache,
                use_cache=True,
            )
        W = bt.P - 1  # target cache width; every row's committed columns are pads[r]..W-1
        Wd = bt.P - 1  # draft cache width, same
        step = 0
        while not all(done):
            active = [r for r in range(B) if not done[r]]
            # ---- draft: re-feed what the draft cache lacks, then K-1 single-token calls
            dfeed = [ctx[r][Wd - bt.pads[r] :] if not done[r] else [] for r in range(B)]
            logits, E = forward(draft, dc, bt, Wd, dfeed, [Wd] * B)
            drafts = [[] for _ in range(B)]
            for r in active:
                drafts[r].append(int(logits[r, len(dfeed[r]) - 1].argmax()))
            width = Wd + E
            for j in range(1, K):
                ids = torch.full((B, 1), PAD, dtype=torch.long)
                pos = torch.zeros((B, 1), dtype=torch.long)
                allowed = torch.zeros((B, 1, width + 1), dtype=torch.bool)
                for r in active:
                    ids[r, 0] = drafts[r][-1]
                    allowed[r, 0, bt.pads[r] : Wd + len(dfeed[r])] = True  # committed
                    allowed[r, 0, Wd + E : width + 1] = True  # earlier drafts and itself
                    pos[r, 0] = bt.pos(r, bt.pads[r] + len(ctx[r]) + j - 1)
                lg = draft(
                    input_ids=ids,
                    attention_mask=add_mask(allowed, draft.dtype),
                    position_ids=pos,
                    cache=dc,
                    use_cache=True,
                ).logits
                for r in active:
                    drafts[r].append(int(lg[r, 0].argmax()))
                width += 1
            # ---- verify: re-feed what the target cache lacks, pending, K drafts
            vfeed = [ctx[r][W - bt.pads[r] :] + drafts[r] if not done[r] else [] for r in range(B)]
            logits, Q = forward(target, tc, bt, W, vfeed, [W] * B, peek=(a.bug == "peek"))
            choice = logits.argmax(-1).tolist()
            if os.environ.get("FM_DEBUG"):
                print(
                    "step",
                    step,
                    "W",
                    W,
                    "Wd",
                    Wd,
                    "refeed",
                    [len(v) - K if v else 0 for v in vfeed],
                    "dfeed",
                    [len(v) for v in dfeed],
                    file=sys.stderr,
                )
            dvalid = {}
            for r in active:
                e = len(vfeed[r]) - K  # re-fed committed tokens, the pending one last
                d = drafts[r]
                acc = 0
                while acc < K and d[acc] == choice[r][e - 1 + acc]:
                    acc += 1
                new = d[:acc] + [choice[r][e - 1 + acc]]
                ctx[r] += new
                # draft cache: columns valid for row r (contiguous committed tokens)
                de = len(dfeed[r])
                dvalid[r] = Wd + E + min(acc, K - 1) if de == E else Wd + de
                new = cut(new, budgets[r] - len(outs[r]))
                outs[r] += new
                fin = new[-1] == EOS or len(outs[r]) >= budgets[r]
                w.emit(r, new, ("eos" if new[-1] == EOS else "length") if fin else None)
                done[r] = fin
            live = [r for r in range(B) if not done[r]]
            if live:
                # crop both caches back to the shortest live row's committed length (minus pending)
                W = min(bt.pads[r] + len(ctx[r]) - 1 for r in live)
                crop(tc, W)
                Wd = min(min(dvalid[r], bt.pads[r] + len(ctx[r]) - 1) for r in live)
                crop(dc, Wd)
            step += 1
    report(outs, prompts, budgets, tok, dtype="bfloat16")


if __name__ == "__main__":
    sys.exit(main())
