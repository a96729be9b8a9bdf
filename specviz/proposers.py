"""The proposer registry: every proposer's name, label and capabilities, and where its class lives.

One table, read by the engine (which class to build, what a run must load), `record`'s
`--proposer` choices, the app's proposer picker, the checks (which state a trace can hold) and the
docs. It imports no torch: the CLI's help and `check` read it without loading the engine, which
imports a proposer's class only when a run builds it (`ProposerKind.build`).

Adding a proposer is one file and one line: the class in `specviz/engine/proposers/` (the
`Proposer` protocol of `engine/proposers/base.py`, with a `for_run(pair, config)` constructor),
and its `ProposerKind` in `REGISTRY` below. Code asks a capability, never a name: "does this
proposer keep a cache", not "is it the draft model" (docs/architecture.md walks through one).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any

from specviz.errors import SpecvizError


@dataclass(frozen=True)
class ProposerKind:
    """A proposer as the rest of specviz sees it: what it is called and what it can do."""

    name: str  # `--proposer NAME`, the trace header's `proposer`
    label: str  # what the app's picker and `--help` call it
    source: str  # "module:Class", imported when a run builds it
    # The methods keep its model's KV cache per row beside the target's, and the trace records that
    # model's calls and cache (`draft_position_ids`, `draft_kv_lens`): checks about them apply.
    keeps_cache: bool
    needs_draft_model: bool  # a run loads the pair's draft model for it (`--draft`)
    drafts_trees: bool  # it proposes a tree's alternatives (`--tree B`), not only a chain
    # It scores its drafts: a top-k tree ranks by those scores, rejection sampling needs them.
    scores: bool

    def build(self, pair: Any, config: Any) -> Any:
        """The run's proposer: the registered class's `for_run(pair, config)`."""
        module, _, name = self.source.partition(":")
        return getattr(import_module(module), name).for_run(pair, config)


DEFAULT_PROPOSER = "draft-model"  # every trace before schema 3 drafted with it

REGISTRY: dict[str, ProposerKind] = {
    kind.name: kind
    for kind in (
        ProposerKind("draft-model", "draft model",
                     "specviz.engine.proposers.draft_model:DraftModelProposer",
                     keeps_cache=True, needs_draft_model=True, drafts_trees=True, scores=True),
        ProposerKind("head", "EAGLE-style head on the target's hidden states",
                     "specviz.engine.proposers.head:HeadProposer",
                     keeps_cache=False, needs_draft_model=False, drafts_trees=True, scores=True),
        ProposerKind("ngram", "n-gram lookup in the prompt",
                     "specviz.engine.proposers.ngram:NgramProposer",
                     keeps_cache=False, needs_draft_model=False, drafts_trees=True, scores=False),
    )
}  # fmt: skip


def proposer_names() -> tuple[str, ...]:
    """Every registered proposer's name, in the registry's order (read when asked, never cached)."""
    return tuple(REGISTRY)


def proposer_kind(name: str) -> ProposerKind:
    """The registered proposer `name`, or a one-line error naming the choices."""
    kind = REGISTRY.get(name) if isinstance(name, str) else None
    if kind is None:
        raise SpecvizError(f"unknown proposer {str(name)[:40]!r}; choose from {', '.join(REGISTRY)}")
    return kind


def keeps_cache(name: str) -> bool:
    """Whether proposer `name` (a trace's, so perhaps another engine's) keeps a draft cache; an
    unregistered name is taken to keep none, so the draft cache's checks do not apply to it."""
    kind = REGISTRY.get(name)
    return kind is not None and kind.keeps_cache
