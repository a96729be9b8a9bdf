"""How each sequence of a watched run ended, and the run's budget: as emitted (the engine's word),
an emitted EOS, or the budget (`max_new_tokens`, never declared: read from where sequences ended
by length)."""

from __future__ import annotations

from specviz.watch.attribution import Emit, Group


def endings(
    groups: list[Group], emits: list[Emit], prompts: list[list[int]], eos: frozenset[int]
) -> tuple[dict[int, list[int]], dict[int, str | None]]:
    """Outputs as emitted (the engine's word), and endings: declared, or an emitted EOS."""
    outputs: dict[int, list[int]] = {seq_id: [] for seq_id in range(len(prompts))}
    reasons: dict[int, str | None] = dict.fromkeys(outputs)
    for emit in emits:
        outputs[emit.seq_id].extend(emit.tokens)
        reasons[emit.seq_id] = emit.finish_reason or reasons[emit.seq_id]
    # A step that emitted an EOS ends there; so does its sequence (its outputs hold every token).
    for group in groups:
        group.finish_reason = _or_eos(group.finish_reason, group.tokens, eos)
    for seq_id, tokens in outputs.items():
        reasons[seq_id] = _or_eos(reasons[seq_id], tokens, eos)
    return outputs, reasons


def _or_eos(reason: str | None, tokens: list[int], eos: frozenset[int]) -> str | None:
    """The ending declared, else "eos" where the tokens hold an EOS."""
    return reason or ("eos" if eos.intersection(tokens) else None)


def budgets(outputs: dict[int, list[int]], reasons: dict[int, str | None]) -> tuple[dict[int, int], int]:
    """Each sequence that ended by length with the length it ended at (its own budget), and the
    run's `max_new_tokens` (never declared): the largest of those, else the longest output."""
    own = {seq_id: len(outputs[seq_id]) for seq_id, reason in reasons.items() if reason == "length"}
    return own, max(own.values(), default=max((len(o) for o in outputs.values()), default=0))


def close_by_length(
    groups: list[Group], outputs: dict[int, list[int]], reasons: dict[int, str | None], max_new: int
) -> None:
    """A sequence that reached the budget without a declared ending ended by length; its last
    step without an ending of its own ends as the sequence did."""
    for seq_id, tokens in outputs.items():
        if reasons[seq_id] is None and max_new and len(tokens) >= max_new:
            reasons[seq_id] = "length"
    for seq_id, group in {g.seq_id: g for g in groups}.items():  # each sequence's last group
        if group.finish_reason is None:
            group.finish_reason = reasons[seq_id]
