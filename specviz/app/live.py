"""Live runs: a request from the slot's controls, validated, decoded on this machine, analysed.

Live runs share this machine's CPU with everyone: the bounds keep one run to about a minute
(smaller in public mode, see `specviz.app.serve`), and one runs at a time (see `specviz.app.events`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import gradio as gr

from specviz.app import files, memory, serve
from specviz.errors import SpecvizError
from specviz.proposers import DEFAULT_PROPOSER, proposer_kind
from specviz.trace.io import save_trace
from specviz.trace.naming import run_slug
from specviz.views import LoadedRun, analyse

PUBLIC = serve.public_mode()  # a Space (SPACE_ID) or `python app.py --public`
LIVE_GATE = serve.LiveRunGate()
LIVE_FOLDER = files.LiveFolder()
RUN_MEMORY = memory.RunMemory(memory.run_memory_ceiling(PUBLIC))  # every session's loaded runs, bounded


@functools.lru_cache(maxsize=2)
def load_model_pair(target: str, draft: str, with_draft: bool) -> Any:
    """Loading is the slow part of a live run; keep the last pairs (tests replace this function)."""
    import torch

    from specviz.engine.models import load_pair

    torch.set_num_threads(1)  # small models on a shared CPU: more threads only add contention
    return load_pair(target, draft, device="cpu", with_draft=with_draft)


@dataclass
class LiveRequest:
    method: str
    fault: str
    batch_size: int
    draft_k: int
    max_new_tokens: int
    num_prompts: int
    prompts_text: str
    target: str
    draft: str
    proposer: str = DEFAULT_PROPOSER  # what drafts: a name in the registry (`specviz/proposers.py`)
    tree_branches: int = 0  # 0: a chain of k drafts; b: b alternatives beside the chain
    tree_kind: str = "static"  # "static": one at each of the first b depths; "topk": each row's b best-scored

    def prompts(self) -> list[str]:
        from specviz.data import load_specbench

        return self.own_prompts() or load_specbench("heldout")[: self.num_prompts]

    def own_prompts(self) -> list[str]:
        return [line.strip() for line in (self.prompts_text or "").splitlines() if line.strip()]

    def validate(self, public: bool = False) -> None:
        limits = serve.live_limits(public)
        for name, (low, high) in limits.items():
            value = getattr(self, name)
            if not isinstance(value, int) or not low <= value <= high:
                raise SpecvizError(f"{name.replace('_', ' ')} must be between {low} and {high}, got {value}")
        if public:  # before anything touches a path: the answer must not depend on it
            from specviz.engine.models import DEFAULT_DRAFT, DEFAULT_TARGET

            serve.public_models_only(self.target, self.draft, (DEFAULT_TARGET, DEFAULT_DRAFT))
        elif not (self.target or "").strip():
            raise SpecvizError("target model path is empty")
        chars = serve.prompt_char_limit(public)
        if len(self.prompts_text or "") > chars * limits["num_prompts"][1]:
            raise SpecvizError(f"prompts text is over {chars * limits['num_prompts'][1]} characters")
        most = limits["num_prompts"][1]
        own = self.own_prompts()
        if len(own) > most:
            raise SpecvizError(f"{len(own)} prompts given; a live run takes at most {most}")
        if any(len(p) > chars for p in own):
            raise SpecvizError(f"a prompt is over {chars} characters")
        self.validate_drafting(limits)

    def validate_drafting(self, limits: dict[str, tuple[int, int]]) -> None:
        """The proposer is one the engine has; a tree fits its k and costs no more than the longest chain.

        A tree adds `tree_branches` nodes to every row's verify forward: 1 + k + branches query
        tokens a row. Capping that at 1 + the largest k keeps a tree run's verify no dearer than
        the dearest chain the limits already allow (the proposer's k calls are not more either)."""
        from specviz.engine.proposers import TREE_KINDS

        proposer_kind(self.proposer)  # a one-line error for a name the registry lacks
        if self.tree_kind not in TREE_KINDS:
            raise SpecvizError(f"unknown tree kind {str(self.tree_kind)[:40]!r}; choose from {', '.join(TREE_KINDS)}")
        if self.method == "baseline":
            if self.tree_branches:
                raise SpecvizError("the baseline drafts nothing: a tree needs a speculative method")
            return
        if self.tree_branches > self.draft_k:
            raise SpecvizError(
                f"tree branches must be at most draft tokens k ({self.draft_k}), got {self.tree_branches}"
            )
        most_nodes = limits["draft_k"][1]
        if self.draft_k + self.tree_branches > most_nodes:
            raise SpecvizError(
                f"a tree of {self.tree_branches} branches on {self.draft_k} drafts verifies "
                f"{1 + self.draft_k + self.tree_branches} tokens a row; a live run verifies at most "
                f"{1 + most_nodes}: lower the tree branches or draft tokens k"
            )


def live_run(request: LiveRequest, progress: gr.Progress, public: bool = False) -> LoadedRun:
    from specviz.engine.models import DEFAULT_DRAFT, DEFAULT_TARGET
    from specviz.engine.run import RunConfig, drafts_with_the_draft_model, run

    request.validate(public)
    config = RunConfig(
        method=request.method,
        fault=None if request.fault in ("", "none") else request.fault,
        batch_size=request.batch_size,
        draft_k=request.draft_k,
        max_new_tokens=request.max_new_tokens,
        proposer=request.proposer,
        tree_branches=request.tree_branches,
        tree_kind=request.tree_kind,
    )
    config.validate()
    progress(None, desc="loading models")  # no fraction to show: no "0.0%" while they load
    target = request.target.strip() or DEFAULT_TARGET
    draft = request.draft.strip() or DEFAULT_DRAFT
    pair = load_model_pair(target, draft, drafts_with_the_draft_model(config))

    def report(phase: str, done: int, total: int) -> None:
        # The reference decodes one prompt at a time; the speculative run counts emitted tokens.
        if phase == "reference":
            progress((done, total), desc="reference (greedy, batch 1)", unit="prompts")
        else:
            # `total` shrinks as sequences stop early (EOS): it counts what can still come.
            progress((done, total), desc=f"{config.method} decoding", unit="tokens")

    trace = run(pair, request.prompts(), config, progress=report)  # the trace carries its token text
    return analyse(trace, "live run")


def whole(value: float | int) -> int | float:
    """Sliders send floats; a whole float is the int the user meant, anything else stays to be refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def save_for_download(loaded: LoadedRun) -> str:
    """The live run's trace in the app's live folder, whose old files are pruned on every save."""
    name = run_slug(loaded.trace.header.method, loaded.trace.header.fault)
    return str(save_trace(loaded.trace, LIVE_FOLDER.new_file(f"live-{name}.json.gz")))
