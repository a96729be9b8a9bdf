"""The synthetic trace the checker's tests edit: a clean one (cached), a copy with one edit, and
where a report's first violation is. Shared by tests/analysis/test_check*.py."""

from __future__ import annotations

import copy
import functools

from specviz.trace.synthetic import synthetic_trace


@functools.cache
def clean_synth():
    return synthetic_trace(24, 8, 4, 24)


def mutated(edit) -> object:
    trace = copy.deepcopy(clean_synth())
    edit(trace)
    return trace


def first(report):
    v = report.first_violation
    return (v.step_index, v.row, v.invariant, v.field)
