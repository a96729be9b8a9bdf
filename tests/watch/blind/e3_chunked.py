"""Engine 3: n-gram (prompt lookup) drafts, chunked prefill mixed into decode, one packed 1 x T
forward per step over ONE shared, append-only KV stream (a batch-1 DynamicCache).

Every forward packs, back to back: each running sequence's [pending, drafts...] and the next
prompt chunk (--chunk C tokens, default 8) of at most one admitted sequence. Each token attends, through a 4-D
boolean mask over [cache | query], the cache columns its own sequence committed plus its own
segment causally. Rejected drafts' KV stays in the stream, unattended. A prompt's last chunk
yields its first token. Budgets differ per prompt; at most R sequences run at once.

Bugs: --bug rejected_kv  : after a partial accept, the first rejected draft's KV column is kept
                           in the sequence's attended set (a rejected draft left attended)
      --bug wrong_row    : at the first step that packs two or more decode segments, the second
                           one's mask rows are built from the previous segment's committed columns
"""

import torch
from common import EOS, args, budgets_for, report, setup, watcher
from transformers import DynamicCache

K, R = 3, 3


def lookup(ctx, k=K):
    """Prompt lookup: the tokens that followed the latest earlier match of the last 2 (then 1) tokens."""
    for n in (2, 1):
        tail = ctx[-n:]
        for i in range(len(ctx) - n - 1, -1, -1):
            if ctx[i : i + n] == tail:
                return ctx[i + n : i + n + k]
    return []


def main():
    a = args({"--chunk": dict(type=int, default=8)})
    C = a.chunk
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    target = pair.target
    cache = DynamicCache(config=target.config)
    cols = {}  # seq -> committed cache columns (all its tokens but the pending one)
    fed = {}  # seq -> prompt tokens already in the cache (while prefilling)
    toks = {i: list(p) for i, p in enumerate(prompts)}
    outs = [[] for _ in prompts]
    waiting = list(range(len(prompts)))
    running = []  # decoding sequences, in admission order
    step, bugged = 0, False
    with watcher(a, pair, prompts, "blind-chunked", use_draft=False) as w:
        while running or waiting or fed:
            segs = []  # (seq, tokens, n_drafts, is_chunk, is_last_chunk)
            for s in running:
                d = lookup(toks[s])[: max(0, budgets[s] - len(outs[s]) - 1)]
                segs.append((s, [toks[s][-1]] + d, len(d), False, False))
            pre = next(iter(fed), None)
            if pre is None and waiting and len(running) < R:
                pre = waiting.pop(0)
                fed[pre], cols[pre] = 0, []
            if pre is not None:
                p = prompts[pre]
                chunk = p[fed[pre] : fed[pre] + C]
                segs.append((pre, chunk, 0, fed[pre] + len(chunk) < len(p), fed[pre] + len(chunk) == len(p)))
            base = cache.get_seq_length()
            T = sum(len(t) for _, t, *_ in segs)
            ids, pos = [], []
            mask = torch.zeros(1, 1, T, base + T, dtype=torch.bool)
            q = 0
            starts = []
            for i, (s, t, *_) in enumerate(segs):
                own = cols[s]
                if a.bug == "wrong_row" and not bugged and i == 1 and not segs[1][3] and not segs[1][4]:
                    own, bugged = cols[segs[0][0]], True
                    print(f"BUG-HIT wrong_row call={step} seq={s} n={len(toks[s])}")
                p0 = fed[s] if s in fed else len(toks[s]) - 1
                starts.append(q)
                for j, tk in enumerate(t):
                    ids.append(tk)
                    pos.append(p0 + j)
                    mask[0, 0, q + j, own] = True
                    mask[0, 0, q + j, base + q : base + q + j + 1] = True
                q += len(t)
            w.batch(
                [s for s, *_ in segs],
                query_lens=[len(t) for _, t, *_ in segs],
                drafts=[d for _, _, d, *_ in segs],
                chunk=[c for *_, c, _ in segs],
            )
            am = (
                target(
                    input_ids=torch.tensor([ids]),
                    position_ids=torch.tensor([pos]),
                    attention_mask=mask,
                    cache=cache,
                    use_cache=True,
                )
                .logits[0]
                .argmax(-1)
                .tolist()
            )
            done = []
            for (s, t, d, is_chunk, last), q0 in zip(segs, starts):
                c0 = base + q0
                if is_chunk:
                    cols[s] += list(range(c0, c0 + len(t)))
                    fed[s] += len(t)
                    continue
                if last:  # the whole prompt is committed; the token it yields is pending now
                    cols[s] += list(range(c0, c0 + len(t)))
                    del fed[s]
                    running.append(s)
                    new = [am[q0 + len(t) - 1]]
                else:
                    acc = 0
                    while acc < d and t[1 + acc] == am[q0 + acc]:
                        acc += 1
                    new = t[1 : 1 + acc] + [am[q0 + acc]]
                    keep = acc + 1 + (1 if (a.bug == "rejected_kv" and acc < d) else 0)
                    if keep > acc + 1:
                        print(f"BUG-HIT rejected_kv call={step} seq={s} n={len(toks[s])} (attended from its next step)")
                    cols[s] += list(range(c0, c0 + keep))
                room = budgets[s] - len(outs[s])
                new = new[:room]
                if EOS in new:
                    new = new[: new.index(EOS) + 1]
                outs[s] += new
                toks[s] += new
                fin = new[-1] == EOS or len(outs[s]) >= budgets[s]
                w.emit(s, new, ("eos" if new[-1] == EOS else "length") if fin else None)
                if fin:
                    done.append(s)
            running = [s for s in running if s not in done]
            step += 1
    report(outs, prompts, budgets, tok)


if __name__ == "__main__":
    main()
