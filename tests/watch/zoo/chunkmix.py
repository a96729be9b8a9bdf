"""An n-gram speculative engine with chunked prefill mixed into decode (written for issue 41's red
team, independently of `chunked.py`; plain Hugging Face forwards, nothing from specviz).

Requests arrive over time: request i arrives at forward `arrive[i]` (default: the first at 0,
then one every `gap` forwards; one that would arrive while nothing runs arrives at once). An
arrived prompt is fed C tokens per forward (`chunk=C`, each prompt its own C). Every forward is ONE
packed 1 x T row over one shared cache (a single-row `DynamicCache` whose slots never move): the
sequences are laid out newest first, so a newcomer's chunk rides in front of the older sequences'
verify segments (pending token + n-gram drafts). The mask is a boolean block-diagonal 4-D mask
[1, 1, T, cache + T]: a query token sees the live slots of its own sequence and the tokens before it
in its own segment. Drafts: the longest suffix (3, 2, then 1 tokens) of the sequence found earlier
in it proposes the tokens that followed it. A chunk that stops short of the prompt's end yields no
token; the chunk that reaches it yields the first token. Rejected drafts' slots are masked out
(holes); a finished sequence's slots are masked out for good. Greedy, each prompt its own budget,
EOS ends a sequence.

`step` (for `events`) counts forwards in which some sequence received a token.

With `w` and `declare`, each forward is declared with `w.batch(ids, query_lens=, drafts=, chunk=)`;
with `w`, each step's tokens are emitted (`w.emit`).

Bugs (events[0] = (step, sequence) where the first wrong thing is fed or kept):
- "chunk_pos0": the final chunk of the first prompt fed in two chunks or more is numbered from 0
  (the engine forgets the chunk's offset in the prompt): wrong positions at that final chunk's step;
- "chunk_trim": the first non-final chunk of a prompt has its slots trimmed like a verify segment
  with no draft accepted (only its first token is kept): the next chunks miss its keys, seen at the
  step where that prompt's final chunk yields;
- "overaccept": the first verify segment that rejects a draft (and does not end its sequence)
  accepts one draft too many: the wrong draft is kept and emitted, with the target's choice after
  it as the bonus.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

BUGS = ("chunk_pos0", "chunk_trim", "overaccept")


def ngram_drafts(tokens: list[int], k: int, longest: int = 3) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix."""
    if k <= 0:
        return []
    for n in range(min(longest, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                return tokens[start + n : start + n + k]
    return []


class _Request:
    def __init__(self, rid: int, prompt: list[int], limit: int) -> None:
        self.rid, self.prompt, self.limit = rid, list(prompt), limit
        self.fed = 0  # prompt tokens in the cache
        self.out: list[int] = []
        self.slots: list[int] = []  # its live cache slots, in order
        self.done = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.out

    @property
    def prefilling(self) -> bool:
        return self.fed < len(self.prompt)


class _PackedCache:
    """One cache row shared by every request; `alive[j]`: slot j is still attended by its owner."""

    def __init__(self, model) -> None:
        self.model, self.cache, self.alive = model, DynamicCache(), []

    @torch.no_grad()
    def run(self, segments):
        """segments: (request, tokens, first position). Returns the logits [T, V] and each
        segment's new slots."""
        base, ids, pos, spans = len(self.alive), [], [], []
        for _req, tokens, first in segments:
            spans.append(list(range(base + len(ids), base + len(ids) + len(tokens))))
            ids += tokens
            pos += range(first, first + len(tokens))
        T = len(ids)
        mask = torch.zeros((1, 1, T, base + T), dtype=torch.bool)
        row = 0
        for (req, tokens, _), span in zip(segments, spans):
            for i in range(len(tokens)):
                mask[0, 0, row + i, req.slots] = True
                mask[0, 0, row + i, span[: i + 1]] = True
            row += len(tokens)
        out = self.model(
            input_ids=torch.tensor([ids]),
            position_ids=torch.tensor([pos]),
            attention_mask=mask,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = out.past_key_values
        self.alive += [True] * T
        return out.logits[0], spans

    def kill(self, slots) -> None:
        for j in slots:
            self.alive[j] = False


def _eos(model) -> set[int]:
    raw = getattr(model.generation_config, "eos_token_id", None) or model.config.eos_token_id
    return set() if raw is None else ({raw} if isinstance(raw, int) else set(raw))


@torch.no_grad()
def generate(target, draft, prompts, max_new, k=3, bug=None, w=None, chunk=2, gap=1, arrive=None, declare=0):
    """`draft` is never called (n-gram drafts). Returns (outputs, events)."""
    if bug not in (None, *BUGS):
        raise ValueError(f"unknown bug {bug!r}")
    n = len(prompts)
    limits = list(max_new) if isinstance(max_new, (list, tuple)) else [max_new] * n
    when = list(arrive) if arrive is not None else [0] + [gap * i for i in range(1, n)]
    reqs = [_Request(i, p, limits[i]) for i, p in enumerate(prompts)]
    eos, kv = _eos(target), _PackedCache(target)
    pending = sorted(range(n), key=lambda i: (when[i], i))
    active: list[_Request] = []  # in arrival order
    events: list[tuple[int, int]] = []
    fired: set[str] = set()
    trimmed: int | None = None  # chunk_trim: the request whose chunk lost its keys
    forward = step = 0
    while pending or active:
        while pending and (when[pending[0]] <= forward or not active):
            active.append(reqs[pending.pop(0)])
        segments, plan = [], []  # plan: ("chunk", ends) | ("verify", drafts)
        for req in reversed(active):  # newest first
            if req.prefilling:
                piece = req.prompt[req.fed : req.fed + chunk]
                ends = req.fed + len(piece) == len(req.prompt)
                first = req.fed
                if bug == "chunk_pos0" and ends and req.fed and "chunk_pos0" not in fired:
                    fired.add("chunk_pos0")
                    first = 0
                    events.append((step, req.rid))
                segments.append((req, piece, first))
                plan.append(("chunk", ends))
            else:
                drafts = ngram_drafts(req.tokens, min(k, req.limit - len(req.out) - 1))
                segments.append((req, [req.tokens[-1], *drafts], len(req.tokens) - 1))
                plan.append(("verify", drafts))
        if w is not None and declare:
            w.batch(
                [req.rid for req, _, _ in segments],
                query_lens=[len(tokens) for _, tokens, _ in segments],
                drafts=[len(d) if kind == "verify" else 0 for kind, d in plan],
                chunk=[p == ("chunk", False) for p in plan],
            )
        logits, spans = kv.run(segments)
        row, gave = 0, False
        for (req, tokens, _), (kind, detail), span in zip(segments, plan, spans):
            picks = logits[row : row + len(tokens)].argmax(-1).tolist()
            row += len(tokens)
            if kind == "chunk":
                req.fed += len(tokens)
                if bug == "chunk_trim" and not detail and "chunk_trim" not in fired and len(span) > 1:
                    fired.add("chunk_trim")
                    trimmed = req.rid
                    kv.kill(span[1:])  # trimmed as if its tokens after the first were rejected drafts
                    span = span[:1]
                req.slots += span
                if not detail:
                    continue  # stops short of the prompt's end: no token
                if trimmed == req.rid:
                    events.append((step, req.rid))
                new = [picks[-1]]
            else:
                drafts = detail
                a = 0
                while a < len(drafts) and drafts[a] == picks[a]:
                    a += 1
                take = a
                if (
                    bug == "overaccept"
                    and a < len(drafts)
                    and "overaccept" not in fired
                    and len(req.out) + a + 2 < req.limit
                    and not eos & set(drafts[: a + 1] + [picks[a + 1]])
                ):
                    fired.add("overaccept")
                    events.append((step, req.rid))
                    take = a + 1  # the rejected draft counted as accepted
                new = drafts[:take] + [picks[take]]
                req.slots += span[: 1 + take]
                kv.kill(span[1 + take :])
            gave = True
            finish = None
            for i, t in enumerate(new):
                if t in eos:
                    new, finish = new[: i + 1], "eos"
                    break
            if finish is None and len(req.out) + len(new) >= req.limit:
                new, finish = new[: req.limit - len(req.out)], "length"
            req.out += new
            if w is not None:
                w.emit(req.rid, new, finish)
            if finish:
                req.done = True
                kv.kill(req.slots)
                req.slots = []
        active = [r for r in active if not r.done]
        forward += 1
        step += gave
    events.sort()
    return [r.out for r in reqs], events
