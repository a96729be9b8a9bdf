"""What the command keeps of a script's decoded outputs (`specviz/watch/infer/decoded.py`), by hand:
the documented bounds of the log (docs/watch-command.md: at most 10,000 lists and 1,000,000 IDs,
a note past that) and the decode wrapper, which records each outermost call once."""

from __future__ import annotations

from types import SimpleNamespace

# The code under test, in one block.
from specviz.watch.infer.decoded import DecodedLog


def test_the_log_keeps_ten_thousand_lists_then_says_so() -> None:
    log = DecodedLog()
    for i in range(9_999):
        log.add([i], 0)
    assert len(log.lists) == 9_999 and not log.full and log.note() is None
    log.add([7, 8], 0)  # the ten-thousandth list is kept
    assert len(log.lists) == 10_000 and log.lists[-1] == ([7, 8], 0) and not log.full
    log.add([9], 0)  # the next one is not
    assert len(log.lists) == 10_000 and log.full
    assert log.note() == (
        "decoded outputs: past 10000 lists (10001 ids) what the script decoded was no longer recorded; "
        "a last step none of the recorded lists shows is read as the target's choices"
    )


def test_the_log_keeps_a_million_ids_then_says_so() -> None:
    log = DecodedLog()
    log.add([[5] * 400_000, [6] * 600_000], None)  # exactly 1,000,000 ids: both kept
    assert [len(ids) for ids, _ in log.lists] == [400_000, 600_000] and log.ids == 1_000_000 and not log.full
    log.add([7], None)  # one id more: not kept, and nothing after it
    assert len(log.lists) == 2 and log.full
    log.add([8], None)
    assert len(log.lists) == 2


def test_the_wrapper_records_each_outermost_decode_once() -> None:
    """A decode that calls decode again inside (a subclass's decode calling the base's, or a
    batch decode per row) is one call: only its outer ids are recorded, with the tokenizer's pad
    id. Every later call, nested or not, is recorded the same way: the nesting count returns to
    zero, also after a decode that raised."""
    log = DecodedLog()
    seen: list[list[int]] = []

    def original(tokenizer, token_ids, *args, **kwargs):
        seen.append(list(token_ids))
        if token_ids == [-1]:
            raise ValueError("the tokenizer's own error")
        if len(token_ids) > 1:  # the base's decode of its first id, inside
            return "w" + decode(tokenizer, token_ids[:1], *args, **kwargs)
        return f"w{token_ids[0]}"

    decode = log.wrap(original)
    tok = SimpleNamespace(pad_token_id=0)
    assert decode(tok, [5, 6], skip_special_tokens=True) == "ww5"
    assert decode(tok, [7]) == "w7"
    try:
        decode(tok, [-1])
    except ValueError:
        pass
    assert decode(tok, [8, 9]) == "ww8"
    assert seen == [[5, 6], [5], [7], [-1], [8, 9], [8]]
    assert log.lists == [([5, 6], 0), ([7], 0), ([-1], 0), ([8, 9], 0)]
