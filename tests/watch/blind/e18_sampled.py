# ruff: noqa: E501  (kept as written: its long debug lines)
"""Speculative SAMPLING (rejection sampling), one left-padded batch, caches that only grow.

Shape: the prompts are left-padded to one width W and prefilled by both models; the target's
prefill samples each row's first token (temperature 0.8). Both models keep a DynamicCache that
only grows; rejected slots become masked holes in 2-D masks. The draft is fed incrementally: each
step's first draft call feeds the committed tokens its cache lacks (the pending token, or d3 plus
the pending token after a full accept), left-padded inside the call with masked pads; two more
one-token calls feed d1 and d2 (d3 is never fed to the draft). Each draft call samples from
q = softmax(logits / 0.8). The target verifies [pending, d1, d2, d3] at logical positions; draft
token d_i is accepted with prob min(1, p(d_i)/q(d_i)), else a token is sampled from
norm(max(0, p - q)) and the step stops; after K accepts the bonus is sampled from p. One
torch.Generator (fixed seed) drives every draw. Finished rows keep computing (their results
are ignored, nothing emitted). K=3.

MATCH here means: the outputs with the watch equal the outputs without it (same seed). A bare run
(command mode) decodes once and prints the outputs only.

Bugs: --bug holepos : positions are the physical column minus the left pad, so they count the
                      masked holes (both models: one position helper)
      --bug keeprej : rejected draft slots stay attended (both models: one mask-update helper)
"""

import os
import sys

import torch
from common import EOS, NoWatch, args, budgets_for, cut, setup, watcher
from transformers import DynamicCache

K = 3
PAD = 1
TEMP = float(os.environ.get("SAMPLE_T", "0.8"))
SEED = 1234


def decode(a, pair, prompts, budgets, w, notes):
    target, draft = pair.target, pair.draft
    n = len(prompts)
    g = torch.Generator().manual_seed(SEED)
    W = max(len(p) for p in prompts)
    pads = [W - len(p) for p in prompts]
    ctx = [list(p) for p in prompts]  # committed tokens per row (keeps going after a row finishes)
    outs = [[] for _ in prompts]
    done = [False] * n
    tcache = DynamicCache(config=target.config)
    dcache = DynamicCache(config=draft.config)
    tmask = [[0] * pads[r] + [1] * len(prompts[r]) for r in range(n)]
    dmask = [list(m) for m in tmask]
    tlen = [len(p) for p in prompts]  # committed tokens held in the target cache
    dlen = [len(p) for p in prompts]  # committed tokens held in the draft cache

    def note(step, seq, why):
        key = (step, seq)
        if key not in notes["seen"]:
            notes["seen"].add(key)
            notes["list"].append(f"step {step} seq {seq}: {why}")

    def pos_of(r, logical, phys_col, step, what):
        """Position for a token at logical index `logical` sitting at physical cache column `phys_col`."""
        if a.bug == "holepos":
            p = phys_col - pads[r]  # BUG: counts every column since the pads, holes included
            if p != logical and not done[r]:
                note(step, r, f"{what}: position {p} instead of {logical}")
            return p
        return logical

    def grow(mask, r, kept, fed, step, what):
        """Append a call's columns to row r's mask: `fed` columns, of which the first `kept` are committed."""
        if a.bug == "keeprej":
            if kept < fed and not done[r]:
                note(step, r, f"{what}: {fed - kept} rejected slot(s) stay attended")
            mask[r] += [1] * fed  # BUG
        else:
            mask[r] += [1] * kept + [0] * (fed - kept)

    def sample(probs):
        return torch.multinomial(probs, 1, generator=g).squeeze(-1)

    def commit(r, toks):
        ctx[r] += toks
        if done[r]:
            return
        new = cut(toks, budgets[r] - len(outs[r]))
        outs[r] += new
        fin = new[-1] == EOS or len(outs[r]) >= budgets[r]
        w.emit(r, new, ("eos" if new[-1] == EOS else "length") if fin else None)
        done[r] = fin

    w.rows(list(range(n)))
    ids = torch.tensor([[PAD] * pads[r] + prompts[r] for r in range(n)])
    am = torch.tensor(tmask)
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    lg = target(input_ids=ids, attention_mask=am, position_ids=pos, cache=tcache, use_cache=True).logits[:, -1]
    draft(input_ids=ids, attention_mask=am, position_ids=pos, cache=dcache, use_cache=True)
    first = sample(torch.softmax(lg.float() / TEMP, -1)).tolist()
    for r in range(n):
        commit(r, [first[r]])

    step = 0
    while not all(done):
        step += 1
        # ---- draft call 1: the committed tokens the draft cache lacks, left-padded in the call
        lack = [ctx[r][dlen[r] :] for r in range(n)]
        T = max(len(x) for x in lack)
        base = len(dmask[0])
        feed, fm, fp = [], [], []
        for r in range(n):
            m = len(lack[r])
            feed.append([PAD] * (T - m) + lack[r])
            fm.append([0] * (T - m) + [1] * m)
            p = [pos_of(r, dlen[r] + i, base + T - m + i, step, "draft catch-up") for i in range(m)]
            fp.append([p[0]] * (T - m) + p)
        lg = draft(
            input_ids=torch.tensor(feed),
            attention_mask=torch.tensor([dmask[r] + fm[r] for r in range(n)]),
            position_ids=torch.tensor(fp),
            cache=dcache,
            use_cache=True,
        ).logits[:, -1]
        for r in range(n):
            dmask[r] += fm[r]
            dlen[r] += len(lack[r])
        qs = [torch.softmax(lg.float() / TEMP, -1)]
        props = [sample(qs[0])]
        dcols = []  # physical draft columns of d1, d2
        for i in range(1, K):
            col = len(dmask[0])
            dcols.append(col)
            fp = [[pos_of(r, dlen[r] + i - 1, col, step, f"draft d{i}")] for r in range(n)]
            lg = draft(
                input_ids=props[-1].unsqueeze(-1),
                attention_mask=torch.tensor([dmask[r] + [1] for r in range(n)]),
                position_ids=torch.tensor(fp),
                cache=dcache,
                use_cache=True,
            ).logits[:, -1]
            for r in range(n):
                dmask[r].append(1)  # tentatively; fixed after the verify
            qs.append(torch.softmax(lg.float() / TEMP, -1))
            props.append(sample(qs[-1]))
        q_prob = torch.stack(qs, 1)  # [n, K, V]
        if os.environ.get("DEBUG2"):
            am_d = q_prob.argmax(-1)
            fed_off = sum(int(props[i][r].item() != am_d[r, i].item()) for r in range(n) for i in range(K - 1))
            print(
                f"STEP {step} draft tokens fed to the draft that are not its argmax: {fed_off} of {n * (K - 1)}"
                f" (d3, never fed: {sum(int(props[K - 1][r].item() != am_d[r, K - 1].item()) for r in range(n))} of {n})",
                file=sys.stderr,
            )
        d_tok = torch.stack(props, 1)  # [n, K]

        # ---- verify [pending, d1..dK]
        tbase = len(tmask[0])
        q_ids, qp = [], []
        for r in range(n):
            q_ids.append([ctx[r][-1]] + d_tok[r].tolist())
            qp.append([pos_of(r, tlen[r] + i, tbase + i, step, "verify") for i in range(K + 1)])
        logits = target(
            input_ids=torch.tensor(q_ids),
            attention_mask=torch.tensor([tmask[r] + [1] * (K + 1) for r in range(n)]),
            position_ids=torch.tensor(qp),
            cache=tcache,
            use_cache=True,
        ).logits
        p_prob = torch.softmax(logits.float() / TEMP, -1)  # [n, K+1, V]
        u = torch.rand((n, K), generator=g)
        for r in range(n):
            acc = 0
            free = None
            while acc < K:
                x = d_tok[r, acc].item()
                px, qx = p_prob[r, acc, x].item(), q_prob[r, acc, x].item()
                if u[r, acc].item() * qx < px:  # accept with prob min(1, p/q)
                    acc += 1
                    continue
                res = (p_prob[r, acc] - q_prob[r, acc]).clamp(min=0)
                if res.sum() <= 0:
                    res = p_prob[r, acc]
                free = sample(res / res.sum()).item()
                break
            if free is None:
                free = sample(p_prob[r, K]).item()
            toks = d_tok[r, :acc].tolist() + [free]
            if os.environ.get("DEBUG2") and not done[r]:
                tam = p_prob[r, acc].argmax().item()
                print(
                    f"STEP {step} seq {r} acc {acc} free token {free} target argmax {tam}"
                    + ("  <- not argmax" if free != tam else ""),
                    file=sys.stderr,
                )
            # masks: target got [pending, d1..d3]: pending + acc committed
            grow(tmask, r, 1 + acc, K + 1, step, "verify")
            tlen[r] += 1 + acc
            # draft cache holds d1, d2 (tentatively attended): keep the accepted ones
            for j, col in enumerate(dcols):
                if j >= acc:
                    if a.bug == "keeprej":
                        if not done[r]:
                            note(step, r, "draft: rejected slot stays attended")
                    else:
                        dmask[r][col] = 0
            dlen[r] += min(acc, K - 1)
            if os.environ.get("DEBUG") and w is not None and not isinstance(w, NoWatch):
                print(step, "seq", r, "done" if done[r] else "live", "acc", acc, "toks", toks, file=sys.stderr)
            commit(r, toks)
    return outs


def main():
    a = args()
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    with torch.no_grad():
        if a.api:
            ref = decode(a, pair, prompts, budgets, NoWatch(), {"seen": set(), "list": []})
            notes = {"seen": set(), "list": []}
            with watcher(a, pair, prompts, "probe-sampledapi") as w:
                outs = decode(a, pair, prompts, budgets, w, notes)
        else:
            ref = None
            notes = {"seen": set(), "list": []}
            outs = decode(a, pair, prompts, budgets, NoWatch(), notes)
        if a.bug:
            import copy

            a0 = copy.copy(a)
            a0.bug = ""
            clean = decode(a0, pair, prompts, budgets, NoWatch(), {"seen": set(), "list": []})
            diff = [i for i in range(len(outs)) if outs[i] != clean[i]]
            print("BUG changes outputs of seqs", diff, "(vs the correct engine, same seed)")
    for i, o in enumerate(outs):
        print(f"seq {i}: {o}  ({tok.decode(o)!r})")
    if notes["list"]:
        print("BUG first effect:", notes["list"][0])
        first_step = int(notes["list"][0].split()[1])
        print("BUG at first step:", "; ".join(x for x in notes["list"] if int(x.split()[1]) == first_step))
    if ref is None:
        print("bare run: nothing to compare")
    else:
        print("MATCH" if ref == outs else "MISMATCH (watched outputs differ from unwatched)")


if __name__ == "__main__":
    main()
