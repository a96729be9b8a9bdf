"""Checks of the optional state fields of schema version 2, run only on rows that record them.

- `query_causal` (`Invariant.KV`): where the verify pass gets a 4-D mask, each query slot may attend
  only itself and the earlier query slots; a non-causal block lets a draft see the drafts after it.
- `draft_position_ids` (`Invariant.POSITIONS`): draft call j of a step feeds its last token at position
  `n - 1 + j` (the pending token, then each new draft), just like the target's query window.
- `draft_kv_lens` (`Invariant.KV`): at draft call j that token attends `n - 1 + j` earlier slots.
- `draft_input_tokens` (`Invariant.DRAFT_INPUT`, schema 4): draft call 0 feeds the row's pending
  token, call j its own draft of call j - 1 (a token gathered from another row, or a stale one,
  leaves outputs exact, since the target verifies, and costs acceptance from that call on).
- `penalty_history_len`, `penalty_added` (`Invariant.SAMPLING_STATE`, schema 4): a repetition
  penalty's history holds the n committed tokens before the step and gains exactly what the step
  emitted, so after every step it is the prompt plus every emitted token.
- `kv_mismatch_slot` (`Invariant.KV`): the engine recomputed the layer-0 keys of the row's attended
  cache slots from its committed tokens and positions, and this slot's content did not match
  (KV copied from another row, stale after a move, written at the wrong position).
The expected values come from `committed_before`, which token accounting ties to the history.
"""

from __future__ import annotations

from specviz.analysis.findings import Findings, RowFlags
from specviz.proposers import keeps_cache
from specviz.trace.invariants import Invariant
from specviz.trace.mask_runs import attended_before
from specviz.trace.schema import Header

# Field -> the skipped-check note when no row of the trace records it. `query_causal` is left
# out: it only exists for engines that feed 4-D masks, so its absence is not a gap.
OPTIONAL_STATE = {
    "draft_position_ids": ("draft position contiguity", "no row records draft_position_ids"),
    "draft_kv_lens": ("draft attended width per draft call", "no row records draft_kv_lens"),
    "draft_input_tokens": ("draft input per draft call", "no row records draft_input_tokens"),
    "kv_content_checked": ("KV content (layer-0 keys vs tokens and positions)", "no row records kv_content_checked"),
}
# A row with drafts whose draft calls were not recorded (a watched engine whose proposals could
# not be matched to the verify): its draft checks did not run on that step.
DRAFT_UNMATCHED = (
    "draft",
    "the draft calls that proposed these drafts were not found (the draft batch held rows that could "
    "not be matched, or the draft state was not recorded)",
)


def check_recorded_row(flag: RowFlags) -> None:
    """Flag what the row's optional state fields show; note which fields the trace records."""
    row = flag.row
    recorded = flag.findings.recorded
    n = row.committed_before
    if row.query_causal is not None:
        recorded.add("query_causal")
        if not row.query_causal:
            flag(
                Invariant.KV,
                "query_causal",
                True,
                False,
                "the verify query block is not causal: a query slot attends a later query slot",
            )
    if row.draft_position_ids is not None:
        recorded.add("draft_position_ids")
        expected = list(range(n - 1, n - 1 + len(row.draft_position_ids)))
        if row.draft_position_ids != expected:
            flag(
                Invariant.POSITIONS,
                "draft_position_ids",
                expected,
                row.draft_position_ids,
                f"draft fed positions {row.draft_position_ids[:3]}... for a row with {n} committed tokens "
                f"(expected to start at {n - 1})",
            )
    if row.draft_kv_lens is not None:
        recorded.add("draft_kv_lens")
        expected = list(range(n - 1, n - 1 + len(row.draft_kv_lens)))
        if row.draft_kv_lens != expected:
            flag(
                Invariant.KV,
                "draft_kv_lens",
                expected,
                row.draft_kv_lens,
                f"draft calls attend {row.draft_kv_lens} earlier slots, expected {expected}",
            )
    if row.draft_input_tokens is not None:
        recorded.add("draft_input_tokens")
        _check_draft_inputs(flag)
    if row.penalty_added is not None or row.penalty_history_len is not None:
        recorded.add("penalty_history")
        _check_penalty_history(flag)
    if row.draft_tokens and row.draft_kv_lens is None and row.draft_kv_len is None:
        flag.skip(*DRAFT_UNMATCHED)
    if row.kv_content_checked or row.kv_mismatch_slot is not None:
        recorded.add("kv_content_checked")
    if row.kv_mismatch_slot is not None:
        slot = row.kv_mismatch_slot
        flag(
            Invariant.KV,
            "kv_mismatch_slot",
            None,
            slot,
            # The token it stands for: the attended slots before it (holes and padding are not tokens).
            f"cache slot {slot} (token {attended_before(row.mask_rle, slot)[0]}) does not hold the layer-0 key"
            " of its token at its position",
        )


# Fields about the draft model's own calls and cache: a run that drafted without one (a head, n-gram
# lookup, the baseline) has no such calls, so their checks do not apply and go unmentioned.
DRAFT_CACHE_FIELDS = ("draft_position_ids", "draft_kv_lens", "draft_input_tokens")


def _check_penalty_history(flag: RowFlags) -> None:
    """Before the step the history holds the n committed tokens; the step appends what it emitted."""
    row = flag.row
    n = row.committed_before
    if row.penalty_history_len is not None and row.penalty_history_len != n:
        flag(
            Invariant.SAMPLING_STATE,
            "penalty_history_len",
            n,
            row.penalty_history_len,
            f"the repetition penalty's history holds {row.penalty_history_len} tokens for a row with {n} committed",
        )
    if row.penalty_added is not None and row.penalty_added != row.emitted:
        flag(
            Invariant.SAMPLING_STATE,
            "penalty_added",
            row.emitted,
            row.penalty_added,
            f"the step emitted {len(row.emitted)} token(s) but appended {len(row.penalty_added)} to the "
            "repetition penalty's history",
        )


def _check_draft_inputs(flag: RowFlags) -> None:
    """Each draft call fed the row's own latest token: its pending token, then its own drafts."""
    row = flag.row
    fed = row.draft_input_tokens
    expected = [row.pending_token, *row.draft_tokens[: max(0, len(fed) - 1)]]
    if fed == expected:
        return
    call = next((j for j, (a, b) in enumerate(zip(fed, expected)) if a != b), min(len(fed), len(expected)))
    flag(
        Invariant.DRAFT_INPUT,
        "draft_input_tokens",
        expected,
        fed,
        f"draft call {call} was fed token {fed[call] if call < len(fed) else None}, not the row's own "
        f"{'pending token' if call == 0 else f'draft of call {call - 1}'} "
        f"{expected[call] if call < len(expected) else None}",
    )


def drafts_with_a_draft_model(header: Header) -> bool:
    """True when a proposer with a cache of its own drafted (its calls and cache could be recorded):
    k > 0 and the registry says the header's proposer keeps one (the draft model; every trace
    before schema 3, which had no other, names it)."""
    return header.draft_k > 0 and keeps_cache(header.proposer)


def note_unrecorded(findings: Findings, header: Header) -> None:
    """Report the optional state checks that no row of the trace made possible (not those that
    cannot apply: the draft model's checks in a run without one)."""
    applies = drafts_with_a_draft_model(header)
    for name, (check, reason) in OPTIONAL_STATE.items():
        if name not in findings.recorded and (applies or name not in DRAFT_CACHE_FIELDS):
            findings.skip(check, reason)
    if "draft_kv_lens" not in findings.recorded:  # said once, for the whole run, above
        findings.skipped.pop(DRAFT_UNMATCHED, None)
