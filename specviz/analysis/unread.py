"""Where a watched run's reading stopped (`header.options`), read without the checker: the
metrics ask it too (an unread run's exact match is not known), and they sit below `findings`."""

from __future__ import annotations

from typing import Any

# header.options key: why `specviz watch --` stopped following an unmodified engine's rows (the
# target calls after that were not read); each reason is a check skipped on the run.
UNFOLLOWED = "watch_unfollowed"
UNFOLLOWED_CHECK = "rows not followed"
# header.options key: {"step": S, "why": ...}: the watch could not map the calls from step S on
# (no producer said which sequence a row or token holds): the run's verdict is "unreadable".
UNREADABLE = "watch_unreadable"
# header.options key: {"SEQ": N, ...}: through the command, the last N tokens of sequence SEQ came
# from its last step, which no later call fed back: read as a greedy engine's (the target's
# choices), not seen. A wrong token there (an engine keeping an off-path draft) cannot show.
READ_AS_GREEDY = "watch_read_as_greedy"


def unreadable_from(options: dict[str, Any], steps: int) -> dict[str, Any] | None:
    """{"step": S, "why": ...} when a watched run could not be read from step S on (its steps
    before S are checked as usual); also a trace written before "unreadable" was a verdict, whose
    reading stopped after its last step (`UNFOLLOWED`). None: read to the end."""
    found = options.get(UNREADABLE)
    if isinstance(found, dict) and "why" in found:
        step = found.get("step")
        return {"step": int(step) if isinstance(step, int) else steps, "why": str(found["why"])}
    reasons = options.get(UNFOLLOWED) or ()
    if reasons:
        return {"step": steps, "why": "; ".join(str(r) for r in reasons)}
    return None


def read_as_greedy(options: dict[str, Any]) -> tuple[int, int]:
    """(sequences, tokens) whose last step was read as greedy, not seen (`READ_AS_GREEDY`); an
    entry that is not a sequence id with a positive count (an edited file) is left out."""
    found = options.get(READ_AS_GREEDY)
    if not isinstance(found, dict):
        return 0, 0
    counts = [n for seq, n in found.items() if str(seq).isdecimal() and type(n) is int and n > 0]
    return len(counts), sum(counts)
