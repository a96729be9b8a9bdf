"""Greedy speculative decoding, EQSPEC-style right-aligned batch (every row's cache ENDS at the
same column).

Shape: prompts left-padded to the longest and prefilled whole by both models (positions from the
mask's cumsum). Each model keeps one DynamicCache whose rows are right-aligned: row r's valid
slots are the LAST lens[r] columns, the 2-D mask is rebuilt from lens (left padding absorbs the
difference) and columns that are padding in every row are dropped. Target cache holds each
row's committed tokens but the pending one; draft cache holds all but the last two. Per step the
draft is fed [seq[-2], pending] then d1, d2 (K=3 drafts); the target verifies [pending, d1, d2,
d3]. After the verify every row keeps 1+acc of the 4 new slots in each model: the slots it
rejected are rolled (torch.roll on the sequence dim of each layer, per row, by 3-acc) round to
the left, where the rebuilt mask calls them padding. Finished rows leave the batch
(index_select on the batch dim). Positions are each row's logical indices.

Bugs: --bug shift1 : in the target's realign the row that accepted fewest drafts (first on ties)
                     is rolled by one slot too many: its last committed slot wraps to the left
                     (masked) and the mask's first valid column holds a slot not its own.
      --bug colpos : decode positions (both models) = column index in [cache | query] minus the
                     batch's minimum left padding (always 0 after the drop), i.e. right only for
                     the row with the longest cache.
"""

import torch
from common import EOS, args, budgets_for, cut, report, setup, watcher
from transformers import DynamicCache

K = 3
PAD = 1


class Aligned:
    """One model's right-aligned cache: DynamicCache + per-row valid counts."""

    def __init__(self, model, bug=""):
        self.model, self.bug = model, bug
        self.cache = DynamicCache(config=model.config)
        self.lens = []

    def width(self):
        return self.cache.get_seq_length()

    def mask(self):
        W = self.width()
        return [[0] * (W - n) + [1] * n for n in self.lens]

    def positions(self, T):
        """Logical index of each row's T query tokens (fed after the cache)."""
        W = self.width()
        if self.bug == "colpos":
            minpad = min(W - n for n in self.lens)
            return [[W + i - minpad for i in range(T)] for _ in self.lens]
        return [[n + i for i in range(T)] for n in self.lens]

    def forward(self, ids, pos=None, qmask=None):
        T = len(ids[0])
        qmask = qmask or [[1] * T for _ in ids]
        am = torch.tensor([m + q for m, q in zip(self.mask(), qmask)])
        pos = torch.tensor(self.positions(T) if pos is None else pos)
        out = self.model(
            input_ids=torch.tensor(ids), attention_mask=am, position_ids=pos, cache=self.cache, use_cache=True
        ).logits
        self.lens = [n + T for n in self.lens]
        return out

    def realign(self, drop, extra=None):
        """Forget each row's last drop[r] slots: roll them round to the left, rebuild the mask,
        cut the columns that are padding in every row."""
        shifts = list(drop)
        if extra is not None:
            shifts[extra] += 1  # the bug: one slot too many
        self.lens = [n - d for n, d in zip(self.lens, drop)]
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)
                t = torch.stack([torch.roll(t[r], shifts=s, dims=-2) if s else t[r] for r, s in enumerate(shifts)])
                setattr(layer, name, t)
        cutcols = self.width() - max(self.lens)
        if cutcols > 0:
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, cutcols:].contiguous()
                layer.values = layer.values[:, :, cutcols:].contiguous()

    def select(self, rows):
        idx = torch.tensor(rows)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, idx)
            layer.values = layer.values.index_select(0, idx)
        self.lens = [self.lens[r] for r in rows]
        self.realign([0] * len(rows))


def main():
    a = args()
    pair, tok, prompts = setup(a.n)
    budgets = budgets_for(a.n)
    B = len(prompts)
    L = [len(p) for p in prompts]
    W = max(L)
    outs = [[] for _ in prompts]
    seqs = [list(p) for p in prompts]
    first_effect = None

    def note(step, seq, why):
        nonlocal first_effect
        if first_effect is None:
            first_effect = (step, seq, why)

    tgt = Aligned(pair.target, a.bug if a.bug == "colpos" else "")
    drf = Aligned(pair.draft, a.bug if a.bug == "colpos" else "")

    with torch.no_grad(), watcher(a, pair, prompts, "probe-roll") as w:
        ids = [[PAD] * (W - L[r]) + p for r, p in enumerate(prompts)]
        am = torch.tensor([[0] * (W - L[r]) + [1] * L[r] for r in range(B)])
        pos = (am.cumsum(-1) - 1).clamp(min=0).tolist()
        for m in (tgt, drf):
            m.lens = [0] * B
        pm = am.tolist()
        lg = tgt.forward(ids, pos, pm)
        drf.forward(ids, pos, pm)
        tgt.lens, drf.lens = list(L), list(L)
        drf.realign([1] * B)  # the draft keeps all but the last two committed tokens
        live = list(range(B))
        for r in range(B):
            t = int(lg[r, -1].argmax())
            new = cut([t], budgets[r])
            outs[r] += new
            seqs[r] += new
            fin = new[-1] == EOS or len(outs[r]) >= budgets[r]
            w.emit(r, new, ("eos" if new[-1] == EOS else "length") if fin else None)
            if fin:
                live.remove(r)
        if len(live) < B:
            keep = [i for i in range(B) if i in live]
            tgt.select(keep)
            drf.select(keep)
            w.rows(live)

        step = 0
        pending_bug = None  # (seq) rolled one too many at the last realign
        while live:
            step += 1
            if a.bug == "colpos":
                for i, s in enumerate(live):
                    if drf.positions(1)[i][0] != drf.lens[i] or tgt.positions(1)[i][0] != tgt.lens[i]:
                        note(step, s, "column positions")
                        break
            if pending_bug is not None and pending_bug in live:
                note(step, pending_bug, "KV rolled one slot too many at the step before")
            pending_bug = None
            # ---- draft: [seq[-2], pending], then d1, d2
            lgd = drf.forward([seqs[s][-2:] for s in live])
            props = [[int(x)] for x in lgd[:, -1].argmax(-1)]
            for _ in range(K - 1):
                lgd = drf.forward([[p[-1]] for p in props])
                for p, x in zip(props, lgd[:, -1].argmax(-1)):
                    p.append(int(x))
            # ---- verify [pending, d1, d2, d3]
            logits = tgt.forward([[seqs[s][-1]] + props[i] for i, s in enumerate(live)])
            choice = logits.argmax(-1).tolist()
            accs = []
            for i, _s in enumerate(live):
                d = props[i]
                acc = 0
                while acc < K and d[acc] == choice[i][acc]:
                    acc += 1
                accs.append(acc)
            extra = None
            if a.bug == "shift1":
                extra = min(range(len(live)), key=lambda i: accs[i])
                pending_bug = live[extra]
            tgt.realign([K - acc for acc in accs], extra)
            drf.realign([K - acc for acc in accs])
            still = []
            for i, s in enumerate(live):
                acc = accs[i]
                new = cut(props[i][:acc] + [choice[i][acc]], budgets[s] - len(outs[s]))
                outs[s] += new
                seqs[s] += new
                fin = new[-1] == EOS or len(outs[s]) >= budgets[s]
                w.emit(s, new, ("eos" if new[-1] == EOS else "length") if fin else None)
                if not fin:
                    still.append(i)
            if len(still) < len(live):
                live = [live[i] for i in still]
                if live:
                    tgt.select(still)
                    drf.select(still)
                    w.rows(live)
    report(outs, prompts, budgets, tok)
    if a.bug:
        print("BUG first effect: step {}, seq {}: {}".format(*first_effect) if first_effect else "BUG no effect")


if __name__ == "__main__":
    main()
