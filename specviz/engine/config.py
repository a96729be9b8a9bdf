"""A run's options (`RunConfig`), validated before any compute."""

from __future__ import annotations

import math
from dataclasses import dataclass

from specviz.engine.faults import FAULTS
from specviz.engine.methods.grouping import POLICIES
from specviz.engine.proposers import TREE_KINDS
from specviz.engine.sampling import SamplingParams
from specviz.errors import SpecvizError
from specviz.proposers import DEFAULT_PROPOSER, proposer_kind
from specviz.trace.schema import METHODS

DEFAULT_KV_CHECK_EVERY = 16


@dataclass
class RunConfig:
    method: str = "eqspec"
    fault: str | None = None
    batch_size: int = 8
    draft_k: int = 4
    max_new_tokens: int = 64
    seed: int = 0
    exspec_window: int | None = None  # default: 6 x batch size (the paper's 48 at batch 8)
    exspec_policy: str = "converge"
    reference: bool = True  # decode the batch-1 greedy oracle too
    record_steps: bool = True  # False: the tracing-off arm of the overhead benchmark
    # Check the target's KV content (layer-0 keys vs tokens and positions) every N steps; 0: never.
    # Part of tracing: off with record_steps. The default keeps its cost small (benchmarks/kv_check_cost.py).
    kv_check_every: int = DEFAULT_KV_CHECK_EVERY
    per_row_loop_move: bool = False  # EQSPEC realigns with the reference's per-row loop (benchmarks only)
    temperature: float = 0.0  # 0: greedy; > 0: sample (keyed by seed, sequence and position)
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    sampling: str = "coupled"  # at temperature > 0: "coupled" (token-exact) or "rejection"
    proposer: str = DEFAULT_PROPOSER  # what drafts: a name in the registry (`specviz/proposers.py`)
    head_path: str | None = None  # the head's folder (default: the embedded default head)
    tree_branches: int = 0  # 0: a chain of k drafts; b: plus b alternative leaves on the chain
    tree_kind: str = "static"  # "static": one alternative at each of the first b depths; "topk": each row's b best
    repetition_penalty: float = 1.0  # transformers' semantics, prompt included (engine/penalty.py); 1: off
    prefill_chunk: int = 0  # 0: each context prefilled in one forward; N: N tokens at a time (engine/prefill.py)

    def validate(self) -> None:
        if self.method not in METHODS:
            raise SpecvizError(f"unknown method {self.method!r}; choose from {', '.join(METHODS)}")
        if self.fault not in (None, "none") and self.fault not in FAULTS:
            raise SpecvizError(f"unknown fault {self.fault!r}; choose from {', '.join(FAULTS)}")
        if self.fault not in (None, "none") and self.method == "baseline":
            raise SpecvizError("faults corrupt speculative methods; use --method eqspec or exspec")
        fault = FAULTS.get(self.fault or "none")
        if fault is not None and self.method == "inplace" and not fault.any_layout:
            raise SpecvizError(
                f"fault {self.fault} models a bug of the left-padded layout (or desyncs lengths a fixed region "
                "cannot hold); use --method eqspec or exspec"
            )
        if self.prefill_chunk < 0:
            raise SpecvizError(f"--prefill-chunk must be 0 (whole prompts) or more, got {self.prefill_chunk}")
        if fault is not None and fault.needs_chunks and not self.prefill_chunk:
            raise SpecvizError(f"fault {self.fault} corrupts chunked prefill; use --prefill-chunk 8 (or any N)")
        if self.batch_size < 1:
            raise SpecvizError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.method != "baseline" and not 1 <= self.draft_k <= 64:
            raise SpecvizError(f"--draft-k must be between 1 and 64, got {self.draft_k}")
        if self.kv_check_every < 0:
            raise SpecvizError(f"--kv-check-every must be 0 (off) or more, got {self.kv_check_every}")
        if self.max_new_tokens < 1:
            raise SpecvizError(f"--max-new-tokens must be at least 1, got {self.max_new_tokens}")
        if self.exspec_policy not in POLICIES:
            raise SpecvizError(f"unknown exspec policy {self.exspec_policy!r}")
        if self.exspec_window is not None and self.exspec_window < self.batch_size:
            raise SpecvizError("--window must be at least the batch size")
        self._validate_sampling()
        self._validate_drafting(fault)

    def _validate_drafting(self, fault: type | None) -> None:
        kind = proposer_kind(self.proposer)
        if not 0 <= self.tree_branches <= (self.draft_k if self.method != "baseline" else 0):
            raise SpecvizError(f"--tree must be between 0 and --draft-k ({self.draft_k}), got {self.tree_branches}")
        if self.tree_kind not in TREE_KINDS:
            raise SpecvizError(f"unknown --tree-kind {self.tree_kind!r}; choose from {', '.join(TREE_KINDS)}")
        if self.tree_kind == "topk" and not self.tree_branches:
            raise SpecvizError("--tree-kind topk needs --tree 1 or more (the number of alternatives per row)")
        if self.tree_branches and not kind.drafts_trees:
            raise SpecvizError(f"--proposer {kind.name} drafts chains only; use --tree 0")
        if self.tree_kind == "topk" and not kind.scores:
            raise SpecvizError(f"--tree-kind topk ranks the proposer's scores; {kind.name} has none (use static)")
        if self.tree_branches and self.temperature > 0:
            raise SpecvizError("tree verification is greedy only; use --temperature 0 or --tree 0")
        if not kind.scores and self.sampling == "rejection" and self.temperature > 0:
            raise SpecvizError(f"--sampling rejection needs the proposer's probabilities; {kind.name} has none")
        if fault is not None and fault.needs_proposer and fault.needs_proposer != self.proposer:
            raise SpecvizError(f"fault {self.fault} corrupts head drafting; use --proposer {fault.needs_proposer}")
        if fault is not None and fault.needs_penalty and self.repetition_penalty == 1.0:
            raise SpecvizError(
                f"fault {self.fault} corrupts the repetition penalty's state; use --repetition-penalty 1.3"
            )
        if fault is not None and fault.needs_tree and not self.tree_branches:
            raise SpecvizError(f"fault {self.fault} corrupts tree verification; use --tree 1 or more")

    def _validate_sampling(self) -> None:
        if self.sampling not in ("coupled", "rejection"):
            raise SpecvizError(f"unknown --sampling {self.sampling!r}; choose coupled or rejection")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SpecvizError(f"--temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SpecvizError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SpecvizError(f"--top-k must be >= 0 (0: off), got {self.top_k}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise SpecvizError(f"--repetition-penalty must be a finite number > 0, got {self.repetition_penalty}")
        if self.repetition_penalty != 1.0 and (self.tree_branches or self.sampling == "rejection"):
            raise SpecvizError(
                "--repetition-penalty works with chains, greedy or coupled sampling (not --tree, "
                "not --sampling rejection)"
            )
        if self.temperature == 0 and (self.top_p < 1 or self.top_k > 0 or self.sampling == "rejection"):
            raise SpecvizError("--top-p, --top-k and --sampling rejection need --temperature > 0")

    @property
    def sampling_params(self) -> SamplingParams:
        """Greedy at temperature 0; else the chosen sampling mode, keyed by `seed`."""
        mode = "greedy" if self.temperature == 0 else self.sampling
        return SamplingParams(mode, self.temperature, self.top_p, self.top_k, self.seed, self.repetition_penalty)

    @property
    def k(self) -> int:
        return 0 if self.method == "baseline" else self.draft_k

    @property
    def window(self) -> int:
        return self.exspec_window or 6 * self.batch_size
