"""A drafting bug injected into vLLM at run time, in every process vLLM starts (vLLM's files are
not edited): put this folder first on PYTHONPATH and set SPECVIZ_DEEP_DRAFT_FAULT=1. Python
imports `sitecustomize` at start-up, the API server's process and its engine core's alike, and
this one patches vLLM's n-gram proposer when vLLM imports it.

The bug: in a batch of two or more requests, every request but the batch's first gets its n-gram
draft corrupted from draft position 1 on (the end-of-text id, never the greedy continuation
mid-answer: what a drafter reading the wrong row's or position's context proposes). Position 0,
and any request decoded alone, are untouched, and the target's verification keeps every answer
right: only the acceptance at depths 1 and after falls, under concurrency. Modelled on real bugs
of that shape, where the first draft step is right and the later ones are not (SGLang PR #25015:
draft positions advanced before instead of after the forward; vLLM #54498: draft KV written from
the wrong position coordinate).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

TARGET = "vllm.v1.spec_decode.ngram_proposer"
WRONG_TOKEN = 0  # the default target's end-of-text id


def _patch(module) -> None:
    propose = module.NgramProposer.propose

    def propose_with_fault(self, num_speculative_tokens, sampled_token_ids, *args, **kwargs):
        drafts = propose(self, num_speculative_tokens, sampled_token_ids, *args, **kwargs)
        if len(sampled_token_ids) < 2:
            return drafts
        return [d if row == 0 else d[:1] + [WRONG_TOKEN] * (len(d) - 1) for row, d in enumerate(drafts)]

    module.NgramProposer.propose = propose_with_fault


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the proposer's module as usual, then patches it once it has run."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # one module, once
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get("SPECVIZ_DEEP_DRAFT_FAULT") == "1":
    sys.meta_path.insert(0, _PatchOnImport())
