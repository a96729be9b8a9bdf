"""An EAGLE-style draft head on the target's hidden states.

The head is a small network fed the target's last hidden state h_i (the input of its LM head, at
the row's last token with KV, logical index n - 2) and the embedding of the next token (the
pending one, index n - 1); it predicts the hidden state at n - 1, which the target's own LM head
turns into a draft for index n. It then runs autoregressively for k steps, each fed its own
predicted hidden state and the embedding of the draft it just chose (EAGLE-1's contract; the head
here is a residual MLP, without EAGLE's attention layer, so it keeps no KV cache of its own).

Each sequence's *carry*: the target hidden state its head reads next step, with where it came
from (sequence, logical index): set after prefill from the last cached token, and after every
verify from the last node of the accepted path. The trace records the source fed each step, and
`check` demands it be the row's own sequence at its n - 2 (docs/forensics.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from specviz.engine.models import DEFAULT_HEAD
from specviz.engine.proposers.base import Alternatives, EngineView, Proposals
from specviz.errors import ModelLoadError

if TYPE_CHECKING:
    from specviz.engine.batch import Batch, SeqState
    from specviz.engine.rules import SampleKeys

HEAD_CONFIG = "head.json"
HEAD_WEIGHTS = "head.safetensors"


class EagleHead(nn.Module):
    """h' = h + W2 silu(W1 [h ; e]): the next hidden state from this one and the next token's embedding."""

    def __init__(self, hidden: int, embed: int, inner: int) -> None:
        super().__init__()
        self.hidden, self.embed, self.inner = hidden, embed, inner
        self.fc_in = nn.Linear(hidden + embed, inner)
        self.fc_out = nn.Linear(inner, hidden)

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        return hidden + self.fc_out(nn.functional.silu(self.fc_in(torch.cat([hidden, embedded], dim=-1))))

    @classmethod
    def for_target(cls, target: Any, inner: int = 256, seed: int = 0) -> EagleHead:
        """A freshly initialised head sized for `target` (deterministic in `seed`)."""
        hidden = target.get_output_embeddings().in_features
        embed = target.get_input_embeddings().embedding_dim
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            head = cls(hidden, embed, inner)
        finally:
            torch.random.set_rng_state(generator_state)
        return head.to(device=target.device, dtype=target.dtype).eval()

    def save(self, folder: str | Path, meta: dict[str, Any] | None = None) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = {"hidden": self.hidden, "embed": self.embed, "inner": self.inner, **(meta or {})}
        (folder / HEAD_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        save_file({k: v.detach().half().contiguous() for k, v in self.state_dict().items()}, str(folder / HEAD_WEIGHTS))


def load_head(folder: str | Path, target: Any) -> EagleHead:
    """A head saved by `EagleHead.save`, checked against `target`'s sizes (one-line errors)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        config = json.loads((folder / HEAD_CONFIG).read_text())
        weights = load_file(str(folder / HEAD_WEIGHTS))
        head = EagleHead(int(config["hidden"]), int(config["embed"]), int(config["inner"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{folder}: cannot load draft head ({str(exc).splitlines()[0][:200]})") from None
    hidden = target.get_output_embeddings().in_features
    embed = target.get_input_embeddings().embedding_dim
    if (head.hidden, head.embed) != (hidden, embed):
        raise ModelLoadError(
            f"{folder}: head made for hidden {head.hidden} / embedding {head.embed}, target has {hidden} / {embed}"
        )
    try:
        head.load_state_dict({k: v.float() for k, v in weights.items()})
    except RuntimeError as exc:
        raise ModelLoadError(f"{folder}: head weights do not fit ({str(exc).splitlines()[0][:200]})") from None
    return head.to(device=target.device, dtype=target.dtype).eval()


class HiddenTap:
    """The target's last hidden states: the input of its LM head, captured while `capture` is open
    (the head calls the LM head too, outside it).

    The hook lives only as long as one capture: a model kept across runs (the app's cached pair)
    never collects hooks, nor old taps holding their last hidden states."""

    def __init__(self, target: Any) -> None:
        self.hidden: torch.Tensor | None = None
        self._lm_head = target.get_output_embeddings()

    def _hook(self, module: Any, args: tuple[Any, ...]) -> None:
        self.hidden = args[0]

    @contextmanager
    def capture(self) -> Iterator[HiddenTap]:
        self.hidden = None
        handle = self._lm_head.register_forward_pre_hook(self._hook)
        try:
            yield self
        finally:
            handle.remove()


@dataclass
class Carry:
    """The hidden state a sequence's head reads next, and where it came from."""

    hidden: torch.Tensor  # [H]
    source_seq: int
    source_index: int  # logical index of the token whose hidden state this is


class HeadProposer:
    """Drafts with an `EagleHead` on the target's hidden states; keeps a carry per sequence."""

    name = "head"
    cache_model = None
    needs_hidden = True

    def __init__(self, head: EagleHead, target: Any) -> None:
        self.head, self.target = head, target
        self.embed, self.lm_head = target.get_input_embeddings(), target.get_output_embeddings()
        self.carry: dict[int, Carry] = {}

    @classmethod
    def for_run(cls, pair: Any, config: Any) -> HeadProposer:
        """The pair's own head, else the one at `config.head_path` (default: the embedded head)."""
        head = pair.head if pair.head is not None and config.head_path is None else None
        if head is None:
            head = load_head(config.head_path or DEFAULT_HEAD, pair.target)
        return cls(head, pair.target)

    def prefilled(self, engine: EngineView, seqs: list[SeqState], hidden: torch.Tensor, last: list[int]) -> None:
        for row, seq in enumerate(seqs):
            if last[row] >= 0:  # a one-token prompt caches nothing: its first step has no carry
                self.carry[seq.seq_id] = Carry(hidden[row, last[row]], seq.seq_id, seq.committed - 2)

    def verified(
        self,
        engine: EngineView,
        seqs: list[SeqState],
        committed: list[int],
        hidden: torch.Tensor,
        slots: list[int],
        depths: list[int],
    ) -> None:
        sources = engine.fault.head_source_rows(len(seqs))  # correct: each row its own
        for row, seq in enumerate(seqs):
            if seq.done:
                self.carry.pop(seq.seq_id, None)
                continue
            src = sources[row]
            if src != row and seqs[src].seq_id != seq.seq_id:
                engine.fault.log.taint_seq(seq.seq_id, f"head carry taken from row {src}'s hidden state")
            self.carry[seq.seq_id] = Carry(hidden[src, slots[src]], seqs[src].seq_id, committed[src] - 1 + depths[src])

    def propose(
        self, engine: EngineView, batch: Batch, pending: torch.Tensor, keys: SampleKeys | None, branches: int
    ) -> Proposals:
        started = engine.now()
        seqs, rules = batch.seqs, engine.rules
        batch_size = len(seqs)
        readers = engine.fault.carry_rows(batch_size)  # correct: each row reads its own sequence's carry
        hidden = pending.new_zeros(batch_size, self.head.hidden, dtype=self.lm_head.weight.dtype)
        sources: list[list[int]] = []
        for row in range(batch_size):
            carry = self.carry.get(seqs[readers[row]].seq_id)
            if readers[row] != row and seqs[readers[row]].seq_id != seqs[row].seq_id:
                engine.fault.log.row(row, f"head fed row {readers[row]}'s carry")
            if carry is None:
                sources.append([])
                continue
            hidden[row] = carry.hidden
            sources.append([carry.source_seq, carry.source_index])
        tokens = pending[:, None]  # [B, 1]
        drafted, kept_logits = [], []
        alternatives = Alternatives(engine.k, branches, engine.config.tree_kind)
        for j in range(engine.k):
            hidden = self.head(hidden, self.embed(tokens[:, -1]))  # [B, H]
            logits = self.lm_head(hidden)[:, None]  # [B, 1, V]
            tokens = rules.select(logits, keys, offset=j)
            drafted.append(tokens)
            alternatives.add(j, logits, tokens)
            if rules.keeps_draft_logits:
                kept_logits.append(logits)
        committed = torch.tensor([s.committed for s in seqs], device=pending.device)
        alternative_tokens, tree = alternatives.tree()
        return Proposals(
            tokens=torch.cat(drafted, dim=1),
            positions=committed[:, None] + torch.arange(engine.k, device=pending.device)[None, :],
            kv_len=None,
            cache_width=0,
            seconds=engine.now() - started,
            logits=torch.cat(kept_logits, dim=1) if kept_logits else None,
            alternatives=alternative_tokens,
            tree=tree,
            head_sources=sources,
        )
