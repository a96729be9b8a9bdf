"""Proposers: what drafts a step's candidates (`base.Proposer`, one small protocol).

- `draft-model`: a separate small LM on its own KV cache (`draft_model.py`);
- `head`: an EAGLE-style head on the target's last hidden states (`head.py`);
- `ngram`: prompt lookup in the row's own text (`ngram.py`).
Every method (EQSPEC, EXSPEC, INPLACE) runs with every proposer, chain or tree. Which ones exist
and what each can do is the registry's to say (`specviz/proposers.py`), not this package's.
"""

from __future__ import annotations

from specviz.engine.proposers.base import TREE_KINDS, Proposals, Proposer, TreeShape, accepted_path
from specviz.engine.proposers.draft_model import DraftModelProposer
from specviz.engine.proposers.head import EagleHead, HeadProposer, load_head
from specviz.engine.proposers.ngram import NgramProposer

__all__ = [
    "TREE_KINDS",
    "DraftModelProposer",
    "EagleHead",
    "HeadProposer",
    "NgramProposer",
    "Proposals",
    "Proposer",
    "TreeShape",
    "accepted_path",
    "load_head",
]
