"""Tree verification, written with plain Hugging Face forwards (nothing from specviz) and on
purpose unlike specviz's own tree engine (`specviz/engine`, `--tree`):

- the draft model keeps no cache and re-reads each row's committed tokens (left-padded, 2-D mask);
  its first call proposes the **top 2** tokens at depth 1 (two branches per row), and each later
  call extends both branches by one greedy token (one draft batch of 2B rows);
- the tree is numbered **level by level** (breadth first): node 0 the pending token, nodes 2d - 1
  and 2d the two branches at depth d. Parents for depth 3: [-1, 0, 0, 1, 2, 3, 4];
- the target verifies all rows' trees in one padded [B, N] forward with an additive 4-D mask whose
  keys are [cache | query]: node i attends its row's live cache slots and, in the query block, its
  ancestors and itself; its position is the row's committed length - 1 + its depth;
- after the verify the target's cache keeps **all** N node slots of every row (a `DynamicCache`
  only appends) and the accepted path's KV is kept **by index**: the root's and the path's slots
  stay attended, every other node's slot becomes a hole the mask never lets in again;
- each prompt has its own budget (rows end at it or at EOS), and a row's tree is only as deep as
  its budget can use (at least 1): near their ends rows verify smaller trees, right-padded in the
  verify (a padding slot attends nothing); finished rows leave the batch
  (`DynamicCache.batch_select_indices`).
With `idle`, finished rows stay in the batch until every row is done, fed the pad id at every
query slot with the query block masked out (each such slot sees its row's cache, nothing of the
query, not even itself), as engines that keep a static batch do; they emit nothing.
With `compact`, the commit instead moves each row's kept nodes to the front of the step's block
and crops the rest (the KV compacted, as specviz's own engine does).
With `declare`, each target forward is declared before it (`w.batch(seq_ids, parents=...)`); else
the rows are declared when they change (`w.rows`) and the watch reads the tree from the mask.
With `packed`, the target verifies the trees the way vLLM's tree attention and packed EAGLE engines
do: ONE 1 x T call holding every live sequence's nodes back to back (level order, node 0 first;
with `rotate`, the sequences in a new order each step),
over one shared cache whose slots never move (`shapes.SharedKV`, prefilled packed too); each node
attends its own sequence's live slots and, among this call's tokens, its ancestors and itself, at
position committed length - 1 + depth. The commit drops every node slot off the accepted path (a
hole). With `declare` it is declared as `w.batch(seq_ids, query_lens=..., parents=...)`; else
nothing but the emitted tokens is told (the watch cuts the call by its mask). The slots never
move, so what a step kept is read from the next call's view, as without `compact`. With
`late` (and `packed`), the last prompt arrives at step `late`: its prefill rides behind the
others' trees in that step's verify call (a causal chain from position 0, emitting nothing), as
vLLM mixes prefills into decoding batches. With `flash` (and `packed`), the mask is boolean and
the calls carry flash attention's varlen metadata (`cu_seq_lens_q/k`, `max_length_q/k`), as
transformers' continuous batching passes them.

Bugs, each breaking one invariant at (step, sequence) = events[0], from step 1 on:
- "sibling" (the row of step 1's second sequence, from then on): the mask is causal over the
  flattened tree: a node sees the nodes listed before it, its siblings and cousins too, not only
  its ancestors (KV; read from an undeclared mask, the tree it then shows disagrees with the
  positions: POSITIONS);
- "positions" (the same row): nodes fed committed length - 1 + node index, not + depth (POSITIONS);
- "off_path" (the same row, once): the commit keeps the first node of the branch the target did
  not choose (the second branch's, or the first's when the target chose the second): a wrong
  output (ACCOUNTING);
- "stale_branch": the commit keeps a rejected node's slot attended, once, in the first row from
  step 1 on that goes on after its step (KV; its next step then attends one slot too many, which
  is where a compacted cache shows it: events[0] is then that next step).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .shapes import NEG, SharedKV, budgets, commit, eos_ids, settle

BUGS = ("sibling", "positions", "stale_branch", "off_path")


def tree_parents(depth: int) -> list[int]:
    """Two branches from the root, each a chain of `depth` nodes, numbered level by level."""
    parents = [-1]
    for d in range(1, depth + 1):
        parents += [0, 0] if d == 1 else [2 * d - 3, 2 * d - 2]
    return parents


def ancestors(parents: list[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out


@torch.no_grad()
def generate(
    target, draft, prompts, max_new, depth=3, bug=None, w=None, declare=0, compact=0, packed=0, idle=0, head=0, **shape
):
    """`shape` (with `packed` only): flash, late, rotate (module docstring), each 0 when absent."""
    if bug not in (None, *BUGS):
        raise ValueError(f"unknown tree bug {bug!r}; one of {BUGS}")
    if (idle or head) and (packed or compact):
        raise ValueError("idle rows and a draft head are a padded, uncompacted batch's")
    if packed:
        if compact:
            raise ValueError("packed keeps its nodes' slots where they are: no compact")
        unknown = set(shape) - {"flash", "late", "rotate"}
        if unknown:
            raise TypeError(f"unknown packed tree options: {sorted(unknown)}")
        return _generate_packed(target, draft, prompts, max_new, depth, bug, w, declare, **shape)
    n = len(prompts)
    limit = budgets(max_new, n)
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    eos, done = eos_ids(target), set()
    active = list(range(n))
    cache, live, last = _prefill(target, [seqs[s][:-1] for s in active])
    events: list[tuple[int, int]] = []
    buggy = None  # the sequence the bug is injected in (step 1's second row)
    step = 0
    if w is not None and not declare:
        w.rows(active)
    while any(s not in done for s in active):
        if step == 1 and bug is not None:
            buggy = [s for s in active if s not in done][min(1, len(active) - len(done & set(active)) - 1)]
        # Each row's tree is as deep as its budget can use (at least 1): a step's trees are ragged.
        trees = [tree_parents(max(1, min(depth, limit[s] - len(outs[s]) - 1))) for s in active]
        width = max(len(parents) for parents in trees)  # the verify's query, right-padded to it
        if head:  # `draft` is a head fed the hidden state that predicted each pending token
            nodes = _propose_head(draft, target, last, [seqs[s][-1] for s in active], depth)
        else:
            nodes = _propose(draft, [seqs[s] for s in active], depth)  # [B][2 * depth], level order
        query, positions, attends = [], [], []
        for r, (s, parents) in enumerate(zip(active, trees)):
            if s in done:  # idle: a pad at every slot, seeing its cache only
                query.append([0] * width)
                positions.append([len(seqs[s]) - 1] * width)
                attends.append([[] for _ in range(width)])
                continue
            pad = width - len(parents)
            query.append([seqs[s][-1], *nodes[r][: len(parents) - 1]] + [0] * pad)
            fed = [len(ancestors(parents, i)) - 1 for i in range(len(parents))]  # depths
            if s == buggy and bug == "positions":
                fed = list(range(len(parents)))
            positions.append([len(seqs[s]) - 1 + d for d in fed] + [0] * pad)
            seen = [ancestors(parents, i) for i in range(len(parents))]
            if s == buggy and bug == "sibling":
                seen = [list(range(i + 1)) for i in range(len(parents))]
            attends.append(seen + [None] * pad)  # a padding slot attends nothing
            if s == buggy and bug in ("positions", "sibling") and not events:
                events.append((step, s))
        if w is not None and declare:
            w.batch(active, parents=trees)
        choices, hidden = _verify(target, cache, live, query, positions, attends)
        keep_rows, kept_rows = [], []
        for r, s in enumerate(active):
            if s in done:  # idle: nothing kept, nothing emitted
                live[r] += [False] * width
                keep_rows.append(r)
                kept_rows.append([])
                continue
            parents = trees[r]
            path = _path(parents, query[r], choices[r])
            if bug == "off_path" and s == buggy and not events:
                path = [1] if path[:1] == [2] else [2]  # the other branch's first node: not the target's choice
                events.append((step, s))
            tokens = [query[r][i] for i in path] + [choices[r][path[-1] if path else 0]]
            last[r] = hidden[r, path[-1] if path else 0]  # it predicted the next pending token
            emitted, finish = settle(outs[s], tokens[: limit[s] - len(outs[s])], limit[s], eos)
            kept = {0, *path}
            if bug == "stale_branch" and step >= 1 and not events and finish is None:
                kept.add(min(set(range(1, len(parents))) - kept))  # a rejected node's KV stays attended
                events.append((step + 1 if compact else step, s))  # compacted: seen at the next step
            kept_rows.append(sorted(kept))
            if not compact:
                live[r] += [i in kept for i in range(width)]
            commit(s, emitted, finish, seqs, outs, done, w)
            if not finish or idle:
                keep_rows.append(r)
        if compact:
            live = _compact(cache, len(live[0]), kept_rows, live)
        if len(keep_rows) < len(active):
            if keep_rows:
                cache.batch_select_indices(torch.tensor(keep_rows))
            live = [live[r] for r in keep_rows]
            active = [active[r] for r in keep_rows]
            last = last[keep_rows]
            if w is not None and not declare and active:
                w.rows(active)
        step += 1
    return outs, events


def _generate_packed(target, draft, prompts, max_new, depth, bug, w, declare, flash=0, late=0, rotate=0):
    """`generate` with every step's trees verified in one packed 1 x T call (module docstring)."""
    n = len(prompts)
    limit = budgets(max_new, n)
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    eos, done = eos_ids(target), set()
    kv = SharedKV(target, flash=bool(flash))
    waiting = {n - 1: late} if late else {}  # sequence -> the step its prefill rides in
    kv.forward([(s, seqs[s][:-1], 0) for s in range(n) if s not in waiting])  # all but each pending token
    events: list[tuple[int, int]] = []
    buggy, step = None, 0
    while active := [s for s in range(n) if s not in done and s not in waiting]:
        if rotate:  # packed in a new order each step
            active = active[step % len(active) :] + active[: step % len(active)]
        if step == 1 and bug is not None:
            buggy = active[min(1, len(active) - 1)]
        trees = [tree_parents(max(1, min(depth, limit[s] - len(outs[s]) - 1))) for s in active]
        nodes = _propose(draft, [seqs[s] for s in active], depth)
        chunks, views = [], []
        for r, (s, parents) in enumerate(zip(active, trees)):
            depths = [len(ancestors(parents, i)) - 1 for i in range(len(parents))]
            fed = list(range(len(parents))) if s == buggy and bug == "positions" else depths
            seen = [ancestors(parents, i) for i in range(len(parents))]
            if s == buggy and bug == "sibling":
                seen = [list(range(i + 1)) for i in range(len(parents))]  # causal over the flattened tree
            chunks.append((s, [seqs[s][-1], *nodes[r][: len(parents) - 1]], [len(seqs[s]) - 1 + d for d in fed]))
            views.append(seen)
            if s == buggy and bug in ("positions", "sibling") and not events:
                events.append((step, s))
        joining = [s for s, at in waiting.items() if at == step]
        for s in joining:  # a prefill behind the trees: a causal chain from position 0
            chunks.append((s, seqs[s][:-1], list(range(len(seqs[s]) - 1))))
            views.append([list(range(i + 1)) for i in range(len(seqs[s]) - 1)])
            del waiting[s]
        if w is not None and declare:
            lens = [len(c[1]) for c in chunks]
            w.batch([c[0] for c in chunks], query_lens=lens, parents=trees + [None] * len(joining))
        choices, slots = _verify_packed(kv, chunks, views)
        for r, s in enumerate(active):
            parents, tokens_in = trees[r], chunks[r][1]
            path = _path(parents, tokens_in, choices[r])
            if bug == "off_path" and s == buggy and not events:
                path = [1] if path[:1] == [2] else [2]
                events.append((step, s))
            tokens = [tokens_in[i] for i in path] + [choices[r][path[-1] if path else 0]]
            emitted, finish = settle(outs[s], tokens[: limit[s] - len(outs[s])], limit[s], eos)
            kept = {0, *path}
            if bug == "stale_branch" and step >= 1 and not events and finish is None:
                kept.add(min(set(range(1, len(parents))) - kept))  # a rejected node's slot stays attended
                events.append((step, s))  # the next call's view of the shared cache shows it kept
            kv.drop([slot for i, slot in enumerate(slots[r]) if i not in kept])
            commit(s, emitted, finish, seqs, outs, done, w)
            if finish:
                kv.release(s)
        step += 1
    return outs, events


def _verify_packed(kv: SharedKV, chunks, views) -> tuple[list[list[int]], list[list[int]]]:
    """One packed 1 x T target forward of every sequence's nodes (`chunks`: sequence, tokens, their
    positions; `views`: per node the nodes it attends); per sequence the target's choice at each
    node and the node's cache slot."""
    at, slots, ids, positions, owners = len(kv.owner), [], [], [], []
    for s, tokens, fed in chunks:
        slots.append(list(range(at, at + len(tokens))))
        at += len(tokens)
        ids += tokens
        positions += fed
        owners += [s] * len(tokens)
    mask = torch.full((1, 1, len(ids), at), NEG)
    t = 0
    for (s, tokens, _), mine, seen in zip(chunks, slots, views):
        context = kv._view(s)
        for i in range(len(tokens)):
            mask[0, 0, t, context + [mine[a] for a in seen[i]]] = 0.0
            t += 1
    extra = {}
    if kv.flash:
        extra = kv._varlen(chunks, mask)
        mask = mask == 0.0
    logits = kv.model(
        **extra,
        input_ids=torch.tensor([ids]),
        position_ids=torch.tensor([positions]),
        attention_mask=mask,
        cache=kv.cache,
        use_cache=True,
    ).logits[0]
    kv._commit([j for mine in slots for j in mine], owners)
    choices = [logits[mine[0] - slots[0][0] : mine[-1] - slots[0][0] + 1].argmax(-1).tolist() for mine in slots]
    return choices, slots


def _compact(cache, width: int, kept_rows: list[list[int]], live: list[list[bool]]) -> list[list[bool]]:
    """Move each row's kept nodes to the front of the step's block and drop the rest of it: the
    block becomes max(kept) slots, a row that kept fewer padded with holes."""
    most = max(len(kept) for kept in kept_rows)
    index = torch.tensor([kept + [kept[0]] * (most - len(kept)) for kept in kept_rows])  # [B, most]
    for layer in cache.layers:
        for name in ("keys", "values"):
            full = getattr(layer, name)  # [B, H, width + N, D]
            pick = index[:, None, :, None].expand(-1, full.shape[1], -1, full.shape[3])
            setattr(layer, name, torch.cat([full[:, :, :width], full[:, :, width:].gather(2, pick)], 2))
    return [row + [True] * len(kept) + [False] * (most - len(kept)) for row, kept in zip(live, kept_rows)]


def _prefill(target, contexts: list[list[int]]) -> tuple[DynamicCache, list[list[bool]], torch.Tensor]:
    """Every row's committed tokens but its pending one, left-padded, into one cache; the last
    hidden state of each row (the one that predicted its pending token)."""
    width = max(len(c) for c in contexts)
    ids = torch.tensor([[0] * (width - len(c)) + c for c in contexts])
    mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    cache = DynamicCache()
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    out = target(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, output_hidden_states=True)
    return cache, [[bool(v) for v in row] for row in mask.tolist()], out.hidden_states[-1][:, -1]


def _propose(draft, contexts: list[list[int]], depth: int) -> list[list[int]]:
    """Per row the tree's nodes 1..N-1 in level order: the draft's top 2 at depth 1, then each
    branch's greedy continuation, one cacheless call per depth."""
    top = _draft_logits(draft, contexts).topk(2, -1).indices.tolist()  # [B, 2]
    branches = [[[a], [b]] for a, b in top]  # [B][2][depth so far]
    for _ in range(1, depth):
        rows = [c + branch for c, pair in zip(contexts, branches) for branch in pair]
        nxt = _draft_logits(draft, rows).argmax(-1).tolist()
        for r, pair in enumerate(branches):
            pair[0].append(nxt[2 * r])
            pair[1].append(nxt[2 * r + 1])
    return [[t for level in zip(a, b) for t in level] for a, b in branches]


def _propose_head(head, target, last: torch.Tensor, pending: list[int], depth: int) -> list[list[int]]:
    """`_propose` from a draft head (`zoo.head.DraftHead`) fed the target's hidden state that
    predicted each pending token and that token's embedding: its top 2 at depth 1, then each
    branch's greedy continuation, the head fed its own feature (EAGLE's recursion)."""
    embed = target.get_input_embeddings()
    out = head(hidden_states=last[:, None], inputs_embeds=embed(torch.tensor(pending)[:, None]))
    top = out.logits[:, -1].topk(2, -1).indices  # [B, 2]
    levels, tokens = [top.tolist()], top.reshape(-1, 1)
    feature = out.hidden_states[-1].repeat_interleave(2, 0)  # [2B, 1, H]: both branches of each row
    for _ in range(1, depth):
        out = head(hidden_states=feature, inputs_embeds=embed(tokens))
        tokens, feature = out.logits[:, -1:].argmax(-1), out.hidden_states[-1]
        levels.append(tokens.view(-1, 2).tolist())
    return [[t for level in levels for t in level[r]] for r in range(len(pending))]


def _draft_logits(draft, rows: list[list[int]]) -> torch.Tensor:
    """The draft's logits after each row's last token ([R, V]), rows left-padded, no cache."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    out = draft(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))
    return out.logits[:, -1]


def _verify(target, cache, live, query, positions, attends) -> tuple[list[list[int]], torch.Tensor]:
    """One target forward over every row's tree; the target's choice at each node ([B][N]) and its
    last hidden state there ([B, N, H])."""
    width, nodes = len(live[0]), len(query[0])
    mask = torch.full((len(query), 1, nodes, width + nodes), NEG)
    for r, row_live in enumerate(live):
        seen = [j for j, on in enumerate(row_live) if on]
        for i in range(nodes):
            if attends[r][i] is not None:
                mask[r, 0, i, seen + [width + a for a in attends[r][i]]] = 0.0
    out = target(
        input_ids=torch.tensor(query),
        position_ids=torch.tensor(positions),
        attention_mask=mask,
        cache=cache,
        use_cache=True,
        output_hidden_states=True,
    )
    return out.logits.argmax(-1).tolist(), out.hidden_states[-1]


def _path(parents: list[int], tokens: list[int], choices: list[int]) -> list[int]:
    """The accepted nodes, root excluded: from the root, the child whose token is the target's
    choice at its parent, while there is one (the two depth-1 tokens differ; deeper nodes have one
    child each, so the path is unique)."""
    path, at = [], 0
    while True:
        child = next((c for c, p in enumerate(parents) if p == at and tokens[c] == choices[at]), None)
        if child is None:
            return path
        path.append(child)
        at = child
