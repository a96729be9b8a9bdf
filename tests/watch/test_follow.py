"""Following rows by their attended context (`specviz.watch.infer.follow`), on calls written by hand: a
greedy engine with a cache, three sequences, whose batch shrinks after its first step.

Which rows the second step's two rows hold is read from each row's pending token and context
length. When both rows fit both sequences left, the rows are followed only if those sequences are
identical so far (any assignment checks alike); otherwise reading stops there, said in the notes and
as a skipped check, never as a violation.
"""

from __future__ import annotations

from specviz.analysis.findings import UNFOLLOWED
from specviz.watch.autowatch import infer
from specviz.watch.hooks import CallRecord

EOS = frozenset([1])


def call(ids: list[list[int]], width: int, argmax: list[list[int]]) -> CallRecord:
    """A target call with a cache of `width` slots, every slot attended, positions fed."""
    q = len(ids[0])
    return CallRecord(
        role="target",
        rows=None,
        input_ids=ids,
        positions=[list(range(width, width + q)) for _ in ids],
        positions_fed=True,
        cache_width=width,
        mask_kind="2d",
        mask=[[1] * (width + q) for _ in ids],
        batch_size=len(ids),
        query_len=q,
        argmax=argmax,
    )


def run(prompts: list[list[int]], step_argmax: list[int], second: list[int]) -> tuple[list, list, list, list]:
    """Prefill of all but the last prompt token, one step of three rows, then two rows fed `second`.
    Returns the prompts and emits read, the notes, and each call's rows then why reading stopped."""
    calls = [
        call([p[:-1] for p in prompts], 0, [[99, 98] for _ in prompts]),  # 98: never the next pending token
        call([[p[-1]] for p in prompts], 2, [[t] for t in step_argmax]),
        call([[t] for t in second], 3, [[50], [51]]),
    ]
    notes: list[str] = []
    unfollowed: list[str] = []
    found_prompts, emits = infer(calls, EOS, notes, unfollowed)
    return found_prompts, emits, notes, [c.rows for c in calls] + [unfollowed]


def test_a_shrinking_batch_whose_rows_swap_is_followed() -> None:
    prompts = [[5, 6, 7], [8, 9, 10], [11, 12, 13]]
    found, emits, notes, rows = run(prompts, [40, 41, 42], [41, 40])  # sequence 2 left; 0 and 1 swapped
    assert found == prompts and not notes
    assert rows[2] == (1, 0)
    tokens = {}
    for e in emits:
        tokens.setdefault(e.seq_id, []).extend(e.tokens)
    assert tokens == {0: [40, 51], 1: [41, 50], 2: [42]}


def test_rows_that_fit_two_different_sequences_are_not_followed() -> None:
    prompts = [[5, 6, 7], [8, 9, 10], [11, 12, 13]]
    found, emits, notes, rows = run(prompts, [40, 40, 42], [40, 40])  # 0 and 1 both fed 40 next
    assert len(notes) == 1 and "fit more than one sequence" in notes[0] and rows[3] == notes
    assert rows[2] is None  # the call was not read
    # What was read stands: the step before, each sequence's tokens as greedy (the last step read).
    assert sorted((e.seq_id, e.tokens) for e in emits) == [(0, [40]), (1, [40]), (2, [42])]


def test_identical_sequences_are_followed_in_the_order_they_held() -> None:
    prompts = [[5, 6, 7], [5, 6, 7], [11, 12, 13]]
    found, emits, notes, rows = run(prompts, [40, 40, 42], [40, 40])
    assert found == prompts and not notes
    assert rows[2] == (0, 1)


def test_a_row_that_continues_no_sequence_stops_reading() -> None:
    prompts = [[5, 6, 7], [8, 9, 10], [11, 12, 13]]
    _, _, notes, rows = run(prompts, [40, 41, 42], [41, 77])  # 77: no step could have committed it
    assert len(notes) == 1 and "row 1 of target call 2 continues no sequence" in notes[0]
    assert rows[3] == notes


def test_the_report_names_the_rows_not_followed(tmp_path) -> None:
    """A trace whose reading stopped lists it among the report's skipped checks, with the reason."""
    from tiny import make_pair
    from zoo import compact

    import specviz
    from specviz.analysis.check import check_trace
    from specviz.analysis.findings import UNFOLLOWED_CHECK

    pair = make_pair("llama")
    prompts = [[5, 6, 7, 8], [11, 12, 13]]
    with specviz.watch(pair.target, pair.draft, prompts=prompts) as w:
        compact.generate(pair.target, pair.draft, prompts, 4, w=w)
    trace = w.trace
    trace.header.options[UNFOLLOWED] = ["rows [0, 1] of target call 9 fit more than one sequence each"]
    report = check_trace(trace)
    (skipped,) = [s for s in report.skipped_checks if s.check == UNFOLLOWED_CHECK]
    assert "target call 9" in skipped.reason and skipped.steps == skipped.of == len(trace.steps)
