"""Sentences a verdict needs where its numbers alone mislead: a DESYNC beside exact outputs, a
fault that was asked for but never fired, and last steps the command read but never saw.
`record`'s summary, `check` and the app say them.
"""

from __future__ import annotations

from specviz.analysis.report import Report
from specviz.analysis.unread import read_as_greedy
from specviz.trace.schema import FAULT_FIRES_ON, Header, Trace

# Fields only the drafter is fed: a wrong one costs acceptance, never the output (the target
# verifies every draft). Every other field is the target's state.
DRAFT_FIELDS = frozenset({"draft_position_ids", "draft_kv_lens", "draft_kv_len", "head_source"})


def exact_desync_note(report: Report) -> str | None:
    """Why a DESYNC verdict matters when every output matched the reference (None otherwise)."""
    if report.verdict != "desync" or report.exact_match != 1.0:
        return None
    fields = {v.field for v in report.violations}
    if fields <= DRAFT_FIELDS:
        return (
            "every output matches the reference: only the drafter was fed a wrong state, and the target "
            "verifies each draft, so what this costs is acceptance (speed), not correctness"
        )
    hid = (
        "rotary position embeddings see only the distance between positions, so shifted position IDs "
        "can leave the outputs unchanged for a while"
        if "position_ids" in fields
        else "a short run can end before the wrong state changes a choice"
    )
    return (
        f"every output matches the reference in this run, yet the target was fed a wrong state: {hid}. "
        "It is still a bug: expect divergence with longer outputs, other prompts or another model"
    )


def fault_never_fired_note(header: Header) -> str | None:
    """'fault X never fired in this run: it fires on METHOD' when the engine injected a fault whose
    decision no step reached (its log is empty); None otherwise, and for a trace whose engine did not
    say where its fault fires (another engine's, or an older specviz's: no guess)."""
    fires_on = header.options.get(FAULT_FIRES_ON)
    if not header.fault or header.fault_events or not isinstance(fires_on, str):
        return None
    when = "in this run" if header.complete else "before this run stopped"
    return f"fault {header.fault} never fired {when}: it fires on {fires_on}"


def read_as_greedy_note(header: Header) -> str | None:
    """What the command took on trust: each sequence's last step, which no later call fed back, was
    read as the target's choices. A run that reads clean is clean only as far as that goes."""
    sequences, tokens = read_as_greedy(header.options)
    if not sequences:
        return None
    return (
        f"the last step of {sequences} sequence(s) ({tokens} token(s)) fed no later call, so `specviz watch --` "
        "read its tokens as the target's choices; the outputs and exact match include them as read, not seen: "
        "an engine that kept a wrong token at a last step shows it only through the API (`emit` or `w.streamer()`)"
    )


def run_notes(trace: Trace, report: Report) -> list[str]:
    """Every note a run's verdict needs, in the order they are read (none for most runs)."""
    notes = (exact_desync_note(report), fault_never_fired_note(trace.header), read_as_greedy_note(trace.header))
    return [note for note in notes if note is not None]
