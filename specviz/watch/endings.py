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
    reasons: dict[int, str | None] = {seq_id: None for seq_id in range(len(prompts))}
    for emit in emits:
        outputs[emit.seq_id].extend(emit.tokens)
        reasons[emit.seq_id] = emit.finish_reason or reasons[emit.seq_id]
    for group in groups:
        if group.finish_reason is None and any(t in eos for t in group.tokens):
            group.finish_reason = "eos"
            reasons[group.seq_id] = reasons[group.seq_id] or "eos"
    for seq_id, tokens in outputs.items():
        if reasons[seq_id] is None and any(t in eos for t in tokens):
            reasons[seq_id] = "eos"
    return outputs, reasons


def run_budget(outputs: dict[int, list[int]], reasons: dict[int, str | None]) -> int:
    """max_new_tokens is not declared: the length at which sequences ended by length, else the longest."""
    by_length = [len(outputs[s]) for s, reason in reasons.items() if reason == "length"]
    return max(by_length) if by_length else max((len(o) for o in outputs.values()), default=0)


def close_by_length(
    groups: list[Group], outputs: dict[int, list[int]], reasons: dict[int, str | None], max_new: int
) -> None:
    """A sequence that reached the budget without a declared ending ended by length."""
    last: dict[int, Group] = {}
    for group in groups:
        last[group.seq_id] = group
    for seq_id, tokens in outputs.items():
        if reasons[seq_id] is None and max_new and len(tokens) >= max_new:
            reasons[seq_id] = "length"
        group = last.get(seq_id)
        if group is not None and reasons[seq_id] is not None and group.finish_reason is None:
            group.finish_reason = reasons[seq_id]
