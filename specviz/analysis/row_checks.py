"""The checks of one batch row at one step: alignment, positions, KV lengths and masks, accounting.

For a row with n = `committed_before` (the last committed token is pending, its KV not cached),
d = len(`draft_tokens`) (0..k: engines shorten or adapt the draft per row and per step), the row's
query q = d + 1 slots and C its context (`cache_len` in a declared layout; in an unspecified one,
whatever the row's mask covers before its query: cached or re-fed, padded on either side):
  ALIGNMENT (left-padded layout only): mask row = 0^pad 1^(C-pad+q), `left_pad` == its leading zeros;
  POSITIONS: position_ids == [n-1, n, ..., n-1+d];
  KV: mask width == C + q (declared layouts); attended context slots == kv_len == n - 1; every
      query slot attended; the draft's attended cache == n - 1;
  ACCOUNTING: d <= k, 0 <= accepted <= d, accepted == the agreeing prefix, emitted ==
      (drafts[:accepted] + [target[accepted]]) cut by the budget and EOS, written to the row's own
      sequence, whose pending token and length match the history; finished sequences never return.
Each check is a function of the row's bound flags (`RowFlags`) and, for accounting, the `History`.
"""

from __future__ import annotations

from specviz.analysis.findings import RowFlags
from specviz.analysis.history import History
from specviz.trace.invariants import Invariant
from specviz.trace.schema import RowRecord, StepRecord

SHOWN_POSITIONS = 64  # expected position lists longer than this are reported by their ends
# Skipped-check notes (check, reason) of a row; the columnar walk leaves the same ones.
NO_MASK = ("rectangular alignment and mask", "rows have no mask_rle")
NOT_LEFT_PADDED = ("rectangular alignment", "the trace declares no left-padded layout")
NO_TARGETS = ("greedy acceptance", "target_tokens missing or not d+1 long")


def check_alignment(flag: RowFlags, runs: list[list[int]], left_padded: bool) -> None:
    """The mask row is `0^pad 1^rest` and `left_pad` counts its leading zeros."""
    row = flag.row
    if not runs:
        flag.skip(*NO_MASK)
        return
    if not left_padded:
        flag.skip(*NOT_LEFT_PADDED)
        return
    lead = runs[0][1] if runs[0][0] == 0 else 0
    holes = [i for i, run in enumerate(runs) if run[0] == 0 and i > 0]
    if holes:
        hole_slots = sum(runs[i][1] for i in holes)
        flag(
            Invariant.ALIGNMENT,
            "mask_rle",
            "no masked slot after the first real slot",
            f"{hole_slots} masked slot(s) inside the row",
            f"{hole_slots} masked hole(s) inside the attended region",
        )
    if row.left_pad != lead:
        flag(
            Invariant.ALIGNMENT,
            "left_pad",
            lead,
            row.left_pad,
            f"left_pad {row.left_pad} but the mask starts with {lead} padding slots",
        )


def row_query_len(step: StepRecord, row: RowRecord) -> int:
    """The row's own query: its pending token and its d drafts (step.query_len if d is not shorter)."""
    return min(len(row.draft_tokens) + 1, step.query_len)


def check_positions(flag: RowFlags) -> None:
    """The verify window is fed positions n-1 .. n-1+d."""
    row, step = flag.row, flag.step
    start = row.committed_before - 1
    # A range, not a list: query_len is declared by the file, only the row's list is real.
    expected = range(start, start + row_query_len(step, row))
    fed = row.position_ids
    if len(fed) != len(expected) or any(p != e for p, e in zip(fed, expected)):
        flag(
            Invariant.POSITIONS,
            "position_ids",
            _shown_range(expected),
            fed,
            f"positions start at {row.position_ids[:1]} for a row with "
            f"{row.committed_before} committed tokens (expected {start})" + _physical_hint(step, row),
        )


# Positions equal to the query's physical columns in the padded tensor: what a model computes for
# itself (from the cache position) when the engine does not pass `position_ids` under padding.
PHYSICAL_POSITIONS = ": positions follow the physical slot, not the row's logical index: is `position_ids` passed?"


def _physical_hint(step: StepRecord, row: RowRecord) -> str:
    """The likely cause when a padded row is fed the query's physical slots (cache_len + j) as positions."""
    fed = row.position_ids
    physical = fed == list(range(step.cache_len, step.cache_len + len(fed)))
    return PHYSICAL_POSITIONS if fed and physical and row.left_pad > 0 else ""


def check_kv(
    flag: RowFlags, runs: list[list[int]], k: int, declared_layout: bool = True, history: History | None = None
) -> None:
    """The target and draft caches attend exactly the n - 1 committed tokens before the pending one
    (`history`, where given, lets the message name a mask never passed)."""
    row = flag.row
    expected = row.committed_before - 1
    if row.kv_len != expected:
        flag(
            Invariant.KV,
            "kv_len",
            expected,
            row.kv_len,
            f"cache holds {row.kv_len} attended slots, expected {expected}"
            + _padding_hint(flag, runs, expected, history),
        )
    if runs:
        _check_mask_counts(flag, runs, declared_layout)
    # draft_kv_lens, where recorded, holds this value first and is checked in full (recorded.py).
    if row.draft_kv_lens is None and row.draft_kv_len is not None and k > 0 and row.draft_kv_len != expected:
        flag(
            Invariant.KV,
            "draft_kv_len",
            expected,
            row.draft_kv_len,
            f"draft cache holds {row.draft_kv_len} attended slots, expected {expected}",
        )


ATTENDS_PADDING = ": row {row} attends its padding ({extra} slot(s) before its context): is `attention_mask` passed?"


def _padding_hint(flag: RowFlags, runs: list[list[int]], expected: int, history: History | None) -> str:
    """The likely cause when a row attends more slots than its context and every step so far,
    from the first, held contexts of different lengths in one rectangular tensor (one mask width)
    yet masked no slot: the batch is padded, so an engine that passed its mask would mask some.
    (An engine that masked a slot once passes a mask: its later excess is another fault, such as
    padding it re-packed as content; rows of one length at the first step have nothing to pad.)"""
    row = flag.row
    if history is None or row.kv_len <= expected or not _unmasked(runs):
        return ""
    if history.unmasked_padded_steps is None:
        steps = history.trace.steps
        count = 0
        while count < len(steps) and _padded_unmasked(steps[count]):
            count += 1
        history.unmasked_padded_steps = count
    if flag.si >= history.unmasked_padded_steps:
        return ""
    return ATTENDS_PADDING.format(row=row.row, extra=row.kv_len - expected)


def _padded_unmasked(step: StepRecord) -> bool:
    """Rows of different contexts in one mask width, none masking a slot (a mask never passed)."""
    rows = [[run for run in r.mask_rle if run[1] > 0] for r in step.rows]
    widths = {sum(run[1] for run in runs) for runs in rows}
    contexts = {r.committed_before for r in step.rows}
    return len(widths) == 1 and len(contexts) > 1 and all(_unmasked(runs) for runs in rows)


def _unmasked(runs: list[list[int]]) -> bool:
    """A recorded mask row that attends every slot."""
    return bool(runs) and all(value for value, _ in runs)


def _check_mask_counts(flag: RowFlags, runs: list[list[int]], declared_layout: bool) -> None:
    """Mask width C + q (declared layouts); attended context slots == kv_len; every query slot attended.

    In an unspecified layout each row's mask is its own context then its own query (rows of one
    step may differ: padding on either side, ragged drafts), so the width is the row's.
    """
    row, step = flag.row, flag.step
    width = sum(run[1] for run in runs)
    query_len = row_query_len(step, row)
    cache_len = step.cache_len if declared_layout else width - query_len
    if declared_layout and width != step.cache_len + step.query_len:
        flag(
            Invariant.KV,
            "mask_rle",
            step.cache_len + step.query_len,
            width,
            f"mask width {width} != cache length {step.cache_len} + query length {step.query_len}",
        )
        return
    attended_cache, attended_query = _split_attended(runs, cache_len)
    if attended_cache != row.kv_len:
        flag(
            Invariant.KV,
            "mask_rle",
            row.kv_len,
            attended_cache,
            f"mask attends {attended_cache} cache slots but kv_len says {row.kv_len}",
        )
    if attended_query != query_len and (declared_layout or attended_query < query_len):
        flag(
            Invariant.KV,
            "mask_rle",
            query_len,
            attended_query,
            f"only {attended_query} of {query_len} query slots attended",
        )


def check_accounting(flag: RowFlags, history: History) -> None:
    """The row's claims match its sequence's history; what it emitted, verification allowed."""
    check_against_history(flag, history)
    row, k = flag.row, history.k
    d = len(row.draft_tokens)
    if d > k or (d < k and not history.ragged):
        flag(Invariant.ACCOUNTING, "draft_tokens", k, d, f"{d} drafts for k={k}")
    if not 0 <= row.accepted <= min(d, k):
        flag(
            Invariant.ACCOUNTING, "accepted", f"0..{min(d, k)}", row.accepted, f"accepted {row.accepted} of {d} drafts"
        )
        return
    if d <= k:  # else flagged above
        _check_acceptance(flag, history)
    check_bonus_and_destination(flag)


def check_bonus_and_destination(flag: RowFlags) -> None:
    """The bonus field matches what was emitted; the tokens went to the row's own sequence."""
    row = flag.row
    # The bonus field names the target token emitted after the accepted drafts, if one was.
    bonus = row.emitted[row.accepted] if len(row.emitted) == row.accepted + 1 else None
    if row.bonus != bonus:
        flag(
            Invariant.ACCOUNTING,
            "bonus",
            bonus,
            row.bonus,
            f"bonus {row.bonus} but the row emitted {len(row.emitted)} token(s) after {row.accepted} accepted",
        )
    if row.write_seq != row.seq_id:
        flag(
            Invariant.ACCOUNTING,
            "write_seq",
            row.seq_id,
            row.write_seq,
            f"row of sequence {row.seq_id} wrote its tokens to sequence {row.write_seq}",
        )


def check_against_history(flag: RowFlags, history: History) -> None:
    """Not finished yet; `committed_before` and `pending_token` are what was written to it so far."""
    row = flag.row
    seq = history.seqs[row.seq_id]
    if seq.finished_at is not None:
        flag(
            Invariant.ACCOUNTING,
            "seq_id",
            "finished sequences leave the batch",
            row.seq_id,
            f"sequence {row.seq_id} finished at step {history.step_numbers[seq.finished_at]} but is decoded again",
        )
    expected_len = seq.prompt_len + seq.written
    if row.committed_before != expected_len:
        flag(
            Invariant.ACCOUNTING,
            "committed_before",
            expected_len,
            row.committed_before,
            f"row claims {row.committed_before} committed tokens; its sequence has {expected_len}",
        )
    if row.pending_token != seq.last_token:
        flag(
            Invariant.ACCOUNTING,
            "pending_token",
            seq.last_token,
            row.pending_token,
            f"fed pending token {row.pending_token}, but the sequence's last token is {seq.last_token}",
        )


def _check_acceptance(flag: RowFlags, history: History) -> None:
    """Greedy: accepted == the agreeing prefix; emitted is a prefix of the allowed tokens."""
    row = flag.row
    d = len(row.draft_tokens)
    if len(row.target_tokens) != d + 1:
        flag.skip(*NO_TARGETS)
        _check_sampled_shape(flag)
        return
    matched = 0
    while matched < d and row.draft_tokens[matched] == row.target_tokens[matched]:
        matched += 1
    if row.accepted != matched:
        flag(
            Invariant.ACCOUNTING,
            "accepted",
            matched,
            row.accepted,
            f"accepted {row.accepted} drafts but only {matched} agree with the target",
        )
    proposal = row.draft_tokens[: row.accepted] + [row.target_tokens[row.accepted]]
    what = "emitted tokens are not a prefix of the accepted drafts plus the bonus" + _eos_hint(row, history)
    check_emitted(flag, history, proposal, what)


def _check_sampled_shape(flag: RowFlags) -> None:
    """Without the target's tokens (a sampled run) what a row may emit still has a shape: the drafts
    it accepted, then at most one token of its own (a rejection's resample or the bonus, free). So
    never more than d + 1 tokens, and never a token before the accepted drafts end."""
    row = flag.row
    drafted = row.emitted[: row.accepted] == row.draft_tokens[: row.accepted][: len(row.emitted)]
    if not drafted or len(row.emitted) > row.accepted + 1:
        flag(
            Invariant.ACCOUNTING,
            "emitted",
            f"the {row.accepted} accepted draft(s), then at most one token",
            row.emitted,
            f"emitted {len(row.emitted)} token(s) with {len(row.draft_tokens)} drafts and {row.accepted} accepted: "
            "a row emits its accepted drafts and at most one more",
        )


def check_emitted(flag: RowFlags, history: History, proposal: list[int], what: str) -> None:
    """The row emitted a prefix of what verification allows: `proposal` (the accepted tokens and
    the bonus) cut at the sequence's end. Emitting fewer (no bonus, say) is slower, not wrong: it
    is the `tokens_left_on_table` metric. Only tokens verification did not allow are a violation."""
    row = flag.row
    expected_out = history.cut(proposal, history.seqs[row.write_seq])
    if row.emitted != expected_out[: len(row.emitted)]:
        flag(Invariant.ACCOUNTING, "emitted", expected_out, row.emitted, what)


def _eos_hint(row: RowRecord, history: History) -> str:
    """Where the target's own token was EOS and the engine emitted something else, the usual cause
    is an EOS-suppressing rule (HF `min_new_tokens`), not a desync: say so in the message."""
    at = row.accepted
    if not (0 <= at < min(len(row.target_tokens), len(row.emitted))):
        return ""
    if row.target_tokens[at] not in history.eos or row.emitted[at] == row.target_tokens[at]:
        return ""
    return (
        " (the target's token there is EOS: if the engine suppresses EOS, e.g. HF min_new_tokens, "
        "its choice is not the raw argmax; watch it with logits_processed=True)"
    )


def _shown_range(expected: range) -> list[int] | str:
    """A violation's expected positions: the list when short, else its ends (reports stay small)."""
    if len(expected) <= SHOWN_POSITIONS:
        return list(expected)
    return f"{expected.start}..{expected.stop - 1} ({len(expected)} positions)"


def _split_attended(runs: list[list[int]], cache_len: int) -> tuple[int, int]:
    """Attended slots before and after the cache/query boundary."""
    cache = query = 0
    pos = 0
    for value, count in runs:
        end = pos + count
        if value:
            in_cache = max(0, min(end, cache_len) - pos)
            cache += in_cache
            query += count - in_cache
        pos = end
    return cache, query
