"""What a step works on: the sequences being decoded and the batch of caches they share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from specviz.engine.kv.state import KVState


@dataclass
class SeqState:
    """One prompt being decoded. Committed tokens = prompt + output; the last is pending."""

    seq_id: int
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    # The tokens a repetition penalty reads: the prompt, then what each step appended (penalty.py).
    penalty_history: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.penalty_history:
            self.penalty_history = list(self.prompt_ids)

    @property
    def committed(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def pending(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def append(self, proposal: list[int], max_new_tokens: int, eos_ids: frozenset[int]) -> list[int]:
        """Append at most the remaining budget, stopping after the first EOS."""
        emitted = proposal[: max(0, max_new_tokens - len(self.output_ids))]
        for i, token in enumerate(emitted):
            if token in eos_ids:
                emitted = emitted[: i + 1]
                self.finish_reason = "eos"
                break
        self.output_ids.extend(emitted)
        if self.finish_reason is None and len(self.output_ids) >= max_new_tokens:
            self.finish_reason = "length"
        return emitted


class Riders(Protocol):
    """Prefill chunks a verify forward carries (`mixed.Aboard`, EXSPEC with --prefill-chunk)."""

    def __bool__(self) -> bool: ...

    def verify(
        self, model: Any, state: KVState, query: torch.Tensor, positions: torch.Tensor, step: int
    ) -> torch.Tensor:
        """The verify forward of `state`'s rows, carrying the chunks: the verify rows' logits."""
        ...


@dataclass
class Batch:
    seqs: list[SeqState]
    target: KVState
    draft: KVState | None  # None: no draft model (the baseline)
    batch_id: int = 0
    regrouped: bool = False  # composition changed since this batch's previous step
    grouped: bool | None = None  # exspec: an equal-length group (no padding)
    # exspec with --prefill-chunk: waiting prompts whose next chunk rides in this step's verify forward
    riders: Riders | None = None
