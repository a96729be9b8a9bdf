"""Exactness: each output against its batch-1 reference (the oracle), and the run's exact match,
known only where the whole output was read."""

from __future__ import annotations

from typing import Any

from specviz.analysis.unread import unreadable_from
from specviz.trace.schema import Trace


def first_divergence(output: list[int], reference: list[int] | None, finished: bool = True) -> int | None:
    """Index of the first token that differs (or where one output stops early); None if equal.

    An unfinished sequence (interrupted run) only has to agree with the reference so far.
    """
    if reference is None or output == reference:  # the common case, compared in C
        return None
    for i, (a, b) in enumerate(zip(output, reference)):
        if a != b:
            return i
    if len(output) == len(reference) or (not finished and len(output) < len(reference)):
        return None
    return min(len(output), len(reference))


def sequence_divergence(seq: Any, run_complete: bool = False) -> int | None:
    """A complete run must have finished every sequence, so there "identical so far" is not enough."""
    return first_divergence(seq.output_ids, seq.reference_ids, run_complete or seq.finish_reason is not None)


def exact_match(trace: Trace) -> float | None:
    """The share of prompts token-identical to their reference; None where it is not known: no
    reference recorded, or a watched run read only up to some step (`unreadable_from`): its outputs
    past that step were never read, so a match of what was read says nothing of the whole output
    (that partial share is `exact_match_read`)."""
    if unreadable_from(trace.header.options, len(trace.steps)) is not None:
        return None
    return exact_match_read(trace)


def exact_match_read(trace: Trace) -> float | None:
    """The share of prompts whose outputs, as far as the trace read them, agree with the reference."""
    with_ref = [s for s in trace.sequences if s.reference_ids is not None]
    if not with_ref:
        return None
    complete = trace.header.complete
    return sum(sequence_divergence(s, complete) is None for s in with_ref) / len(with_ref)
