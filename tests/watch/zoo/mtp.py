"""An MTP-like head called INSIDE the target's forward: no draft model, no head call of the engine's
own. `attach` gives the target a `mtp` module and a forward hook on its final norm, so every target
call runs the head on the norm's output (the LM head's input) at every query slot before the LM
head runs; the head feeds that hidden state, with the embedding of the target's own choice there,
through `head.DraftHead`'s fitted map and proposes the token after it. k = 1: the logits at a row's
accepted slot are its next step's draft (`generate`). The target verifies with a cache that keeps
holes (`common.HoleCache`); finished rows are dropped. Pass `drafter=target.mtp` to the watch.
With `dtype=torch.float16` the head is kept in half precision and fed the hidden states cast to it
(a production engine's fp16 head on an fp32 trunk).

Bugs, each at (step, sequence) = events[0]:
- "head_row": the head call that proposes step 2's drafts (made inside step 1's verify) is fed
  the batch's hidden states with rows rotated by one: row r drafts from row r - 1's state. The
  drafts change, the outputs do not (the target verifies them);
- "head_stale": that same head call is fed step 0's verify hidden states (one target call older)
  at the same slots.
"""

from __future__ import annotations

import torch
from torch import nn

from .common import HoleCache, verify
from .head import DraftHead
from .shapes import budgets, commit, eos_ids, settle


class MTPHead(nn.Module):
    """logits of the token after the target's choice at each slot, from that slot's hidden state."""

    def __init__(self, target, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.inner = DraftHead(target)
        self.lm_head = target.get_output_embeddings()
        self.embed = target.get_input_embeddings()
        self.inner.to(dtype)
        self.dtype = dtype
        self.bug: str | None = None  # set by `generate`: which head call to misfeed, and how
        self.at: int | None = None  # the target call (0: prefill) whose head call is misfed
        self.calls = 0
        self.previous: torch.Tensor | None = None  # the hidden states of the target call before
        self.latest: torch.Tensor | None = None  # the logits of the latest call, [B, T, V]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        choice = self.lm_head(hidden_states.to(self.lm_head.weight.dtype)).argmax(-1)
        embeds = self.embed(choice).to(hidden_states.dtype)
        return self.inner(hidden_states=hidden_states, inputs_embeds=embeds).logits


def attach(target, dtype: torch.dtype = torch.float32) -> MTPHead:
    """The target's `mtp` head, run by a forward hook on its final norm (one head of each dtype
    made; attaching another dtype's replaces the hook)."""
    heads = target.__dict__.setdefault("_mtp_heads", {})
    if dtype not in heads:
        heads[dtype] = MTPHead(target, dtype)
    if getattr(target, "mtp", None) is not heads[dtype]:
        if getattr(target, "_mtp_hook", None) is not None:
            target._mtp_hook.remove()
        target.mtp = heads[dtype]
        target._mtp_hook = target.model.norm.register_forward_hook(_run_head(target.mtp))
    return target.mtp


def _run_head(head: MTPHead):
    @torch.no_grad()
    def hook(module, args, hidden: torch.Tensor) -> None:
        fed = hidden
        if head.calls == head.at and head.bug == "head_row" and hidden.shape[0] > 1:
            fed = hidden.roll(1, 0)
        if head.calls == head.at and head.bug == "head_stale" and head.previous is not None:
            fed = head.previous[:, -hidden.shape[1] :]
        head.previous = hidden.detach().clone()
        head.calls += 1
        head.latest = head(hidden_states=fed.to(head.dtype)).float()

    return hook


@torch.no_grad()
def generate(target, prompts, max_new, bug=None, w=None, dtype: torch.dtype = torch.float32):
    """Greedy with one MTP draft a step; returns (outputs, events)."""
    head = attach(target, dtype)
    head.bug, head.at, head.calls = bug, 2, 0  # call 0 the prefill, 1 step 0's verify, 2 step 1's
    limit = budgets(max_new, len(prompts))
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    batch = list(range(len(prompts)))
    if w is not None:
        w.rows(batch)
    cache = HoleCache(target, seqs)  # its prefill call runs the head on the prompts' states
    proposal = head.latest[:, -1].argmax(-1).tolist()  # the slot that predicted each pending token
    eos, done = eos_ids(target), set()
    events: list[tuple[int, int]] = []
    step = 0
    while batch:
        if w is not None:
            w.rows(batch)
        drafts = [[proposal[r]] if limit[s] - len(outs[s]) > 1 else [] for r, s in enumerate(batch)]
        if bug and step == 2 and not events:
            events += [(step, s) for r, s in enumerate(batch) if drafts[r]][:1]
        logits = cache.forward([[seqs[s][-1]] + d for s, d in zip(batch, drafts)])
        choices = logits.argmax(-1).tolist()
        kept, proposal = [], []
        for r, s in enumerate(batch):
            a = verify(drafts[r], choices[r])
            tokens, finish = settle(outs[s], drafts[r][:a] + [choices[r][a]], limit[s], eos)
            kept.append(1 + a)
            proposal.append(int(head.latest[r, a].argmax()))  # the accepted slot's head logits
            commit(s, tokens, finish, seqs, outs, done, w)
        cache.keep(kept)
        live = [r for r, s in enumerate(batch) if s not in done]
        if live and len(live) < len(batch):
            cache.select(live)
        proposal = [proposal[r] for r in live]
        batch = [batch[r] for r in live]
        step += 1
    return outs, events
