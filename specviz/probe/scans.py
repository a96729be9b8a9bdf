"""Scans of side B's answer for corruption that side A's answer to the same prompt lacks.

A batching bug does not always flip a near-tie: it can leak a special token's text into the
answer, switch to another writing system mid-answer, or fall into a loop. Each scan looks only at
what B has and A (and the prompt) do not, so a model that loops or writes CJK on its own is not
flagged.

- `special`: a special token's text (BOS, EOS, pad, chat-turn markers) in B's text, absent
  from A's and the prompt's: a row read another row's or the padding's output.
- `script`: a writing system (by Unicode character name: LATIN, CYRILLIC, CJK, ...) with at least
  SCRIPT_MIN_CHARS letters in B's text, none of which appear in A's answer or the prompt.
- `loop`: B's text ends in a block of LOOP_MIN_REPEATS or more identical repeats (period up to
  LOOP_MAX_PERIOD characters, LOOP_MIN_CHARS at least), A's does not.

Leaked special tokens and a change of script are corruption whatever the divergence's margin
(they make the prompt suspect); a loop is shown but decides nothing, because a small model decoding
greedily may loop on its own once a numerical flip has put it on another path.
"""

from __future__ import annotations

import unicodedata

SPECIAL_TEXTS = (
    "<s>", "</s>", "<pad>", "<unk>", "<bos>", "<eos>", "[PAD]", "[CLS]", "[SEP]", "<|endoftext|>",
    "<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>",
    "<start_of_turn>", "<end_of_turn>", "<|end|>", "<|padding|>",
)  # fmt: skip
SCRIPT_MIN_CHARS = 3
LOOP_MAX_PERIOD = 40
LOOP_MIN_REPEATS = 4
LOOP_MIN_CHARS = 16
KINDS = ("special", "script", "loop")
DECISIVE = ("special", "script")  # kinds that make a prompt suspect


def _scripts(text: str) -> dict[str, int]:
    """Letters per writing system (the first word of the character's Unicode name)."""
    counts: dict[str, int] = {}
    for ch in text:
        if not ch.isalpha():
            continue
        name = unicodedata.name(ch, "")
        script = name.split(" ", 1)[0] if name else "UNKNOWN"
        if script in ("CJK", "HIRAGANA", "KATAKANA"):
            script = "CJK"
        counts[script] = counts.get(script, 0) + 1
    return counts


def loop_period(text: str) -> int | None:
    """The period of a repeated block B's text ends in, or None."""
    for period in range(1, min(LOOP_MAX_PERIOD, len(text) // LOOP_MIN_REPEATS) + 1):
        unit = text[-period:]
        if not unit.strip():
            continue
        repeats = 1
        while text.endswith(unit * (repeats + 1)):
            repeats += 1
        if repeats >= LOOP_MIN_REPEATS and repeats * period >= LOOP_MIN_CHARS:
            return period
    return None


def scan(prompt: str, text_a: str, text_b: str) -> tuple[tuple[str, str], ...]:
    """Findings (kind, detail) for side B's answer; empty when B shows nothing A lacks."""
    found: list[tuple[str, str]] = []
    for special in SPECIAL_TEXTS:
        if special in text_b and special not in text_a and special not in prompt:
            found.append(("special", f"{special!r} in side B's text"))
            break
    seen = _scripts(text_a + prompt)
    for script, count in _scripts(text_b).items():
        if count >= SCRIPT_MIN_CHARS and script not in seen:
            found.append(("script", f"{count} {script} letters in side B's text, none in A's or the prompt"))
            break
    period = loop_period(text_b)
    if period is not None and loop_period(text_a) is None:
        found.append(("loop", f"side B ends in a loop of {period} characters"))
    return tuple(found)
