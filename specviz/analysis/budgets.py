"""Each sequence's own token budget, as a trace declares it.

A watched engine may give each request its own max_new_tokens; the watch writes the ones that
differ from the run's to `header.options[BUDGETS]`. Every reader of a budget (the checks, the
metrics, the views) asks here, so JSON and Parquet traces give the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable

from specviz.trace.schema import Header

# header.options key: {seq_id (a string): its own max_new_tokens}, where a watched engine gave
# sequences budgets of their own (the header's max_new_tokens is then the largest).
BUDGETS = "sequence_budgets"


def sequence_budgets(header: Header, seq_ids: Iterable[int]) -> dict[int, int]:
    """Each sequence's own max_new_tokens: `header.options[BUDGETS]` where it gives one, else the
    run's `max_new_tokens`. An entry that is not a non-negative integer (an uploaded file's) is not
    a budget: that sequence keeps the run's, so a bad value cannot stop the check."""
    own = header.options.get(BUDGETS)
    own = own if isinstance(own, dict) else {}
    budgets = {}
    for seq_id in seq_ids:
        n = own.get(str(seq_id))
        ok = isinstance(n, int) and not isinstance(n, bool) and n >= 0
        budgets[seq_id] = n if ok else header.max_new_tokens
    return budgets
