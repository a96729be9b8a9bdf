"""`--replay MODEL`: logprob evidence recomputed locally, for servers that give none.

The model decodes nothing: it scores each prompt's side-A answer (teacher forcing) twice, at
batch 1 and in a left-padded batch of the run's concurrency, both in --replay-dtype. The batch-1
pass gives the reference gap at the divergent token (logprob(a) - logprob(b), exact: the whole
distribution is there); the batched pass gives the margin changes on the shared prefix that the
noise estimate needs. In half precision those changes are quantized (0, or at least one step of
the logits' dtype): each prompt carries that step as its resolution, below which the noise rule
measures nothing (attribution.py). So the noise is this model's batch-shape noise at that dtype: pick the
server's dtype. The server's tokens are mapped to IDs with the model's tokenizer (IDs the server
gave are used as they are; a text token that encodes to one ID is that ID; otherwise the answer
text is re-tokenized).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch

from specviz.probe.compare import CONTEXT_CHARS, END, Evidence, Shown
from specviz.probe.prompts import Prompt
from specviz.probe.responses import Answer, Token


@dataclass
class _Row:
    evidence: Evidence
    prompt_ids: list[int]
    answer_ids: list[int]  # side A's tokens up to and including the divergent one
    other_id: int | None  # side B's token at the divergence (None: B stopped; EOS)


class Replayer:
    def __init__(self, path: str, dtype: str, endpoint: str) -> None:
        from specviz.engine.models import eos_ids, load_causal_lm, load_tokenizer, resolve_dtype

        device = torch.device("cpu")
        self.tokenizer = load_tokenizer(path)
        self.model = load_causal_lm(path, device, resolve_dtype(dtype, device))
        self.eos = eos_ids(self.model, self.tokenizer)
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos[0]
        self.endpoint = endpoint
        self.resolution = 0.0  # of the last forward's logits (_ulp)

    # -- tokens -------------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[Token]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return [Token(self.tokenizer.decode([i]), i) for i in ids]

    def answer_ids(self, answer: Answer) -> list[int]:
        if answer.tokens:
            ids = []
            for token in answer.tokens:
                if token.id is None:
                    mapped = self.tokenizer(token.text, add_special_tokens=False)["input_ids"]
                    if len(mapped) != 1:
                        break
                    ids.append(mapped[0])
                else:
                    ids.append(token.id)
            else:
                return ids
        return [t.id for t in self.tokenize(answer.text)]  # type: ignore[misc]

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        if self.endpoint == "chat" and getattr(self.tokenizer, "chat_template", None):
            out = self.tokenizer.apply_chat_template(prompt.as_messages(), add_generation_prompt=True, tokenize=True)
            return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)
        return self.tokenizer(prompt.as_text())["input_ids"]

    # -- evidence -----------------------------------------------------------------------------

    def fill(self, items: list[tuple[Prompt, Answer, Answer, Evidence]], batch: int) -> None:
        """Recompare `items` on token IDs and replace their logprob evidence by replayed evidence."""
        rows = []
        for prompt, a, b, ev in items:
            ids_a, ids_b = self.answer_ids(a), self.answer_ids(b)
            n = min(len(ids_a), len(ids_b))
            d = next((j for j in range(n) if ids_a[j] != ids_b[j]), None)
            if d is None and len(ids_a) != len(ids_b):
                d = n
            ev.divergence, ev.unit, ev.length_a, ev.length_b = d, "token", len(ids_a), len(ids_b)
            if d is not None:
                ev.context = self.tokenizer.decode(ids_a[:d])[-CONTEXT_CHARS:]
            other = ids_b[d] if d is not None and d < len(ids_b) else None
            rows.append(_Row(ev, self.prompt_ids(prompt), ids_a[: d + 1] if d is not None else ids_a, other))
        for start in range(0, len(rows), max(batch, 1)):
            self._score(rows[start : start + max(batch, 1)])

    @torch.inference_mode()
    def _logprobs(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """Per sequence, (len, vocab) float32 logprobs of the next token after each position."""
        width = max(len(s) for s in sequences)
        ids = torch.tensor([[self.pad] * (width - len(s)) + s for s in sequences])  # (B, width)
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        self.resolution = _ulp(logits)
        lp = torch.log_softmax(logits.float(), dim=-1)
        return [lp[r, width - len(s) :] for r, s in enumerate(sequences)]

    def _score(self, rows: list[_Row]) -> None:
        sequences = [r.prompt_ids + r.answer_ids for r in rows]
        single, resolution = [], 0.0
        for s in sequences:
            single.append(self._logprobs([s])[0])
            resolution = max(resolution, self.resolution)
        batched = self._logprobs(sequences) if len(sequences) > 1 else single
        resolution = max(resolution, self.resolution)
        for row, lp1, lpb in zip(rows, single, batched):
            ev, n = row.evidence, len(row.prompt_ids)
            d = ev.divergence if ev.divergence is not None else len(row.answer_ids)
            # output token j is predicted at position n - 1 + j: (d, 2) top-2 logprobs
            tops1 = lp1[n - 1 : n - 1 + d].topk(2, dim=-1).values
            topsb = lpb[n - 1 : n - 1 + d].topk(2, dim=-1).values
            changes = ((tops1[:, 0] - tops1[:, 1]) - (topsb[:, 0] - topsb[:, 1])).abs().tolist()
            ev.prefix_tokens = len(changes)
            ev.prefix_median = statistics.median(changes) if changes else None
            ev.prefix_max = max(changes) if changes else None
            ev.source = "replay"
            ev.pair, ev.pairs = None, {}  # both sides recomputed by one local model: one path
            ev.resolution = resolution
            if ev.divergence is None:
                continue
            dist = lp1[n - 1 + d]  # (vocab,)
            eos = max(self.eos, key=lambda i: float(dist[i]))
            a = row.answer_ids[d] if d < len(row.answer_ids) else eos  # A stopped here: EOS
            b = row.other_id if row.other_id is not None else eos
            top2 = dist.topk(2).values
            ev.gap_a, ev.gap_b, ev.lower_bound = float(dist[a] - dist[b]), None, False
            ev.top_margin_a = float(top2[0] - top2[1])
            ev.token_a = self._shown(a, dist, a == eos and d >= len(row.answer_ids))
            ev.token_b = self._shown(b, dist, row.other_id is None)

    def _shown(self, token: int, dist: torch.Tensor, ended: bool) -> Shown:
        text = END if ended else self.tokenizer.decode([token])
        return Shown(text, None if ended else token, float(dist[token]), None)


def _ulp(logits: torch.Tensor) -> float:
    """The spacing of the logits' dtype at their largest magnitude: margins computed from them
    move in steps of this, so a change of one step is not a measurable difference (float32: tiny;
    bfloat16 logits near 5: 0.03125)."""
    largest = float(logits.detach().abs().max()) if logits.numel() else 0.0
    if largest == 0.0 or not math.isfinite(largest):
        return 0.0
    return float(torch.finfo(logits.dtype).eps) * 2.0 ** math.floor(math.log2(largest))
