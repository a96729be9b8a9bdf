"""What a run decodes with (`EngineConfig`, fixed for the run) and what it accumulates as it goes
(`RunContext`): the two inputs of `step.Engine`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from specviz.engine.faults import Fault
from specviz.engine.kv.content import KVContentChecker
from specviz.engine.prefill import PrefillRecord
from specviz.engine.proposers.base import Proposer
from specviz.engine.proposers.draft_model import DraftModelProposer
from specviz.engine.rules import TokenRules
from specviz.trace.recorder import NullRecorder, Recorder


@dataclass(frozen=True)
class EngineConfig:
    """What a run decodes with: fixed for the run."""

    target: Any
    draft: Any | None  # the model whose KV cache methods keep beside the target's (set from the proposer)
    k: int
    max_new_tokens: int
    eos_ids: frozenset[int]
    pad_id: int
    device: torch.device
    fault: Fault = field(default_factory=Fault)
    rules: TokenRules = field(default_factory=TokenRules)
    kv_check_every: int = 0  # check the target's KV content every N steps (0: never)
    proposer: Proposer | None = None  # None with a draft model: that model drafts (today's default)
    tree_branches: int = 0  # 0: a chain; b: b alternative leaves on the main chain (TreeShape)
    tree_kind: str = "static"  # "static": one at each of the first b depths; "topk": each row's b best-scored
    prefill_chunk: int = 0  # 0: prefill each context in one forward; N: N columns at a time (prefill.py)

    def __post_init__(self) -> None:
        if self.proposer is None and self.draft is not None:
            object.__setattr__(self, "proposer", DraftModelProposer(self.draft))
        if self.proposer is not None:
            object.__setattr__(self, "draft", self.proposer.cache_model)
        if (self.proposer is None) != (self.k == 0):
            raise ValueError(f"a proposer needs k >= 1 and k >= 1 needs a proposer (k={self.k})")
        if not 0 <= self.tree_branches <= self.k:
            raise ValueError(f"tree branches must be between 0 and k={self.k}, got {self.tree_branches}")

    @property
    def cache_headroom(self) -> int:
        """Headroom a cache keeps past its width (kv/headroom.py): a step feeds each cache at most
        k + 1 + branches slots (the draft's catch-up token plus its proposals; the verify block)."""
        return self.k + 2 + self.tree_branches


@dataclass
class RunContext:
    """What a run accumulates: the recorder, the step count, the tracing cost, the KV check."""

    recorder: Recorder = field(default_factory=lambda: NullRecorder(header=None))  # outside `run`: nothing
    on_tokens: Callable[[int], None] | None = None  # progress: tokens emitted this step
    step_index: int = 0
    # Seconds spent tracing (the recorder's `record_step` and the sampled KV-content check): the
    # cost of a traced run measured inside it, free of the run-to-run noise of comparing two runs.
    tracing_seconds: float = 0.0
    kv_checker: KVContentChecker | None = None
    kv_check_unavailable: str | None = None  # why the KV-content check was switched off mid-run
    # seq_id -> what a chunked prefill fed it, until its next step records it (prefill.py)
    prefills: dict[int, PrefillRecord] = field(default_factory=dict)
