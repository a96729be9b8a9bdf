"""What an engine and its models tell the watch, checked where it comes in: declared trees,
segments (drafts, chunks), prompts, emits and the temperature, each refused with a one-line
`WatchError` when malformed; and the models' own end-of-sequence and padding ids."""

from __future__ import annotations

import math
from typing import Any

import numpy
import torch

from specviz.watch.attribution import Emit
from specviz.watch.hooks import WatchError
from specviz.watch.record import CallRecord
from specviz.watch.tree import tree_error


def checked_trees(parents: Any, rows: int, model: str) -> list[list[int]]:
    """One tree per declared row (None: a prefill riding along), each its parent indices (`tree_error`)."""
    if model != "target":
        raise WatchError("batch: parents= declares the target's trees (not the draft's)")
    if hasattr(parents, "tolist"):  # a tensor of parents, one row per sequence
        parents = parents.tolist()
    try:
        trees = [None if p is None else list(p) for p in parents]
    except TypeError:
        raise WatchError("batch: parents= is one list of parent indices per row") from None
    if len(trees) != rows:
        raise WatchError(f"batch: {rows} sequences need {rows} trees in parents=, got {len(trees)}")
    for r, tree in enumerate(trees):
        problem = None if tree is None else tree_error(tree)
        if problem is not None:
            raise WatchError(f"batch: the tree of row {r} {tree[:8]}: {problem}")
    return trees


def checked_segments(drafts: Any, chunk: Any, lens: list[int] | None, rows: int) -> tuple[tuple[int | None, bool], ...]:
    """(drafts, chunk) per declared sequence: its draft tokens (None: not said, read from the draft
    calls), fewer than its query; whether it is a prefill chunk, which yields no token (no drafts)."""
    said = [None] * rows if drafts is None else [None if d is None else as_int(d, "batch") for d in drafts]
    chunks = [False] * rows if chunk is None else list(chunk)
    if {len(said), len(chunks)} != {rows}:
        raise WatchError(f"batch: {rows} sequences need {rows} entries in drafts= and chunk=")
    for r, c in enumerate(chunks):
        if not isinstance(c, bool):
            raise WatchError(f"batch: chunk= is one bool per sequence, got {c!r} at {r}")
    # At least 0 drafts, none in a chunk, fewer than the query (None, not said: nan, never refused).
    drafted = numpy.array(said, dtype=float)
    refused = numpy.flatnonzero((drafted < 0) | (drafted >= numpy.where(chunks, 1, lens or math.inf)))
    if refused.size:
        r = int(refused[0])
        raise WatchError(f"batch: sequence {r} cannot carry {said[r]} drafts (a chunk none, else fewer than its query)")
    return tuple(zip(said, chunks))


def checked_temperature(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise WatchError(f"temperature must be a finite number >= 0 (0: greedy), got {value!r}")
    return float(value)


def as_int(value: Any, what: str) -> int:
    """An id as a Python int: an int, a numpy integer or a one-element tensor of one (never a bool)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)):
        raise WatchError(f"{what}: expected integer ids, got {type(value).__name__}")
    return int(value)


def prompt_ids(prompts: list[Any] | None, tokenizer: Any | None) -> list[list[int]] | None:
    """Each prompt's token ids: a list of ids, or a string the tokenizer encodes."""
    if prompts is None:
        return None
    prompts = list(prompts)
    if not prompts:
        raise WatchError("prompts: empty list")
    out = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if tokenizer is None:
                raise WatchError("prompts are strings: pass tokenizer= to turn them into token ids")
            ids = list(tokenizer(prompt)["input_ids"])
        else:
            ids = [as_int(t, f"prompts[{i}]") for t in prompt]
        if not ids:
            raise WatchError(f"prompts[{i}] is empty")
        out.append(ids)
    return out


def eos_ids(model: Any, tokenizer: Any | None) -> list[int]:
    """The generation config's EOS ids, else the config's; and the tokenizer's."""
    configs = (getattr(model, "generation_config", None), getattr(model, "config", None))
    said = next((ids for config in configs if (ids := _eos_of(config))), [])
    return sorted({*said, *_eos_of(tokenizer)})


def _eos_of(source: Any) -> list[int]:
    """`source.eos_token_id` as a list: one id, a list or tuple of them, or none (None, no source)."""
    raw = getattr(source, "eos_token_id", None)
    if isinstance(raw, int):
        return [raw]
    return [int(i) for i in raw] if isinstance(raw, (list, tuple)) else []


def pad_id(model: Any, tokenizer: Any | None) -> int | None:
    """The tokenizer's pad id, else the generation config's, else the config's."""
    for source in (tokenizer, getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(source, "pad_token_id", None)  # None without a source
        if isinstance(value, int):
            return value
    return None


def require_emits(calls: list[CallRecord], emits: list[Emit]) -> None:
    """A finished run that decoded (two target calls or more) but declared no token: say what is missing."""
    if not emits and [c.role for c in calls].count("target") >= 2:
        raise WatchError(
            "the target ran but no tokens were declared: call w.emit(seq_id, tokens) after each step, "
            "pass streamer=w.streamer() to generate, or watch the unmodified script with `specviz watch --`"
        )


def require_prompted(prompts: list[list[int]], emits: list[Emit]) -> None:
    """A sequence emitted beyond the prompts read from the first target call (one that joined later)
    has no prompt to decode its reference from: say so, not guess it."""
    beyond = sorted({e.seq_id for e in emits if e.seq_id >= len(prompts)})
    if beyond:
        raise WatchError(
            f"emit named sequence {beyond[0]}, but the first target call holds {len(prompts)} prompt(s): "
            "pass prompts=[...] to specviz.watch (a sequence that joins later has no prompt to read there)"
        )
