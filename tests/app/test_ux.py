"""The first hour of a new user (issue 13), item by item where no browser is needed: token text in
CLI traces, `check` and the pandas view; help texts; thread default; fault one-liners; progress
units; the output card's wording; the grid's first-violation mark; heatmap heights.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from tiny import make_pair

from specviz.analysis.check import check_trace
from specviz.analysis.report import Report, Violation
from specviz.analysis.slots import step_slots
from specviz.cli import main
from specviz.engine.faults import FAULTS
from specviz.engine.run import RunConfig, run
from specviz.threads import DEFAULT_THREADS
from specviz.trace import steps_frame
from specviz.trace.io import load_trace, parse_trace_bytes, trace_to_json
from specviz.trace.schema import Header, ModelInfo, RowRecord, SequenceRecord, StepRecord, Trace
from specviz.views.faults import FAULT_DESCRIPTIONS, fault_markdown
from specviz.views.grid import grid_figure, legend_items
from specviz.views.heatmaps import ROW_PX, acceptance_heatmap, kv_heatmap
from specviz.views.outputs import RunOutputs, outputs_html
from specviz.views.palette import FIRST_FLAG_COLOR
from specviz.views.run import analyse, slot_summary_markdown

PROMPTS = ["hello world", "a longer prompt here", "xy", "the quick brown fox", "zz top", "ab", "cd", "ef", "gh"]


@pytest.fixture(scope="module")
def cli_trace(tmp_path_factory: pytest.TempPathFactory, tiny_model_dirs: tuple[str, str]) -> Path:
    """A faulty run recorded by the CLI on tiny model directories."""
    target, draft = tiny_model_dirs
    out = tmp_path_factory.mktemp("runs") / "extra.json.gz"
    argv = ["record", "--target", target, "--draft", draft, "--fault", "extra-accept", "--batch-size", "4"]
    argv += ["--draft-k", "3", "--max-new-tokens", "12", "--num-prompts", "6", "--out", str(out)]
    assert main(argv) == 0
    return out


def test_cli_recorded_trace_carries_token_text_and_check_shows_it(cli_trace: Path, capsys) -> None:
    trace = load_trace(cli_trace)
    ids = {t for s in trace.sequences for t in s.output_ids + s.prompt_ids}
    assert ids <= {int(k) for k in trace.header.token_text}, "every token of the trace has its text"
    capsys.readouterr()
    status = main(["check", str(cli_trace)])
    out = capsys.readouterr().out
    assert status == 1 and "verdict: DESYNC" in out
    seq = next(s for s in check_trace(trace).sequences if s.first_divergence is not None)
    divergent = trace.header.token_text[str(seq.context_output[min(seq.first_divergence, 4)])]
    assert f"[{divergent}]" in out, out  # the divergent token as text, bracketed, beside its ids
    assert "output position" in out


def test_steps_frame_has_text_columns_after_the_old_ones(cli_trace: Path) -> None:
    trace = load_trace(cli_trace)
    frame = steps_frame(trace)
    assert list(frame.columns[-4:]) == ["pending_text", "draft_text", "target_text", "emitted_text"]
    first = frame.iloc[0]
    assert first.pending_text == trace.header.token_text[str(first.pending_token)]
    assert len(first.draft_text) == len(first.draft_tokens) and all(isinstance(t, str) for t in first.draft_text)


def test_token_text_is_optional_and_old_option_slot_still_reads(cli_trace: Path) -> None:
    trace = load_trace(cli_trace)
    stripped = copy.deepcopy(trace)
    stripped.header.token_text = {}
    assert parse_trace_bytes(trace_to_json(stripped).encode()).header.token_text == {}  # absent: empty
    legacy = copy.deepcopy(trace)
    legacy.header.options["token_text"], legacy.header.token_text = legacy.header.token_text, {}
    assert analyse(legacy, "legacy").texts  # the earlier draft's slot still shows text


def test_help_states_exit_codes_defaults_and_threads(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    check = capsys.readouterr().out
    assert "exit status" in check and "A trace is" in check
    for code in ("0 ", "1 ", "2 "):
        assert f"\n  {code}" in check
    with pytest.raises(SystemExit):
        main(["record", "--help"])
    record = capsys.readouterr().out
    assert "(default: 8)" in record and "(default: eqspec)" in record and "--threads" in record
    assert f"(default: {DEFAULT_THREADS})" in " ".join(record.split())


def test_every_fault_has_a_one_liner_linking_the_docs() -> None:
    assert set(FAULTS) <= set(FAULT_DESCRIPTIONS), set(FAULTS) - set(FAULT_DESCRIPTIONS)
    line = fault_markdown("uniform-advance")
    assert "docs/faults.md" in line and "\n" not in line
    assert fault_markdown(None) == "" and "<" not in fault_markdown("<img src=x>")


def test_progress_counts_prompts_then_tokens_and_ends_at_100_percent() -> None:
    calls: list[tuple[str, int, int]] = []
    pair = make_pair("llama")
    run(pair, PROMPTS[:4], RunConfig(batch_size=2, draft_k=3, max_new_tokens=40), progress=lambda *a: calls.append(a))
    reference = [c for c in calls if c[0] == "reference"]
    decode = [c for c in calls if c[0] == "decode"]
    assert reference[-1] == ("reference", 4, 4)  # prompts
    assert decode[-1][1] == decode[-1][2]  # the bar closes full even when sequences end early


def _hand_trace(position_ids: list[int]) -> Trace:
    info = ModelInfo("hand", "float32", "cpu", 100, 1)
    header = Header(2, "eqspec", None, info, info, 2, 1, 2, [], 0, 0, "2025-01-01T00:00:00+00:00", {})
    # Sequence 0 at its first step: 1 pad + 2 prompt tokens cached, pending + 2 drafts, 1 accepted.
    row = RowRecord(
        row=0, seq_id=0, committed_before=3, left_pad=1, left_pad_after=None, pending_token=13,
        draft_tokens=[21, 22], target_tokens=[21, 30, 31], accepted=1, bonus=30, emitted=[21, 30], write_seq=0,
        position_ids=position_ids, mask_rle=[[0, 1], [1, 5]], kv_len=2, kv_len_expected=2, finished=True,
        finish_reason="length",
    )  # fmt: skip
    step = StepRecord(0, 0, 3, 3, None, 0.0, 0.0, 0.0, 0.0, [row])
    return Trace(header, [step], [SequenceRecord(0, "p", [11, 12, 13], [21, 30], "", None, None, "length")])


def test_first_violation_mark_stays_where_it_was_placed() -> None:
    """A later violation in the row that marks an earlier query slot must not move the red cell."""
    trace = _hand_trace([2, 2, 4])  # draft 1 (column 4) fed position 2, expected 3
    first = Violation(0, 0, 0, 0, 2, "position-contiguity", "position_ids", 3, 2, "first")
    later = Violation(0, 0, 0, 0, 4, "token-accounting", "draft_tokens", None, None, "later")  # anchors at pend
    report = Report("desync", [first, later], [], None, 0.5, [])
    slots = step_slots(trace, 0, report)
    assert slots.first_violation == (0, 4)
    assert slots.row(0).slots[3].flagged  # the later one did mark the pending slot


def test_first_violation_cell_is_dark_red_and_its_number_readable() -> None:
    trace = _hand_trace([2, 2, 4])
    report = check_trace(trace)
    fig = grid_figure(step_slots(trace, 0, report), selected_row=0)
    assert any(s.fillcolor == FIRST_FLAG_COLOR for s in fig.layout.shapes)
    numbers = [a for a in fig.layout.annotations if a.name == "first-cell"]
    assert numbers and numbers[0].text == "<b>2</b>" and numbers[0].font.color == "white"
    label = next(a for a in fig.layout.annotations if "desync" in (a.text or ""))
    assert label.x >= len(fig.data[0].z[0]) - 0.5  # the arrow ends at the row's edge, over no cell
    names = [label for _, label in legend_items(step_slots(trace, 0, report), 0)]  # the HTML legend's entries
    assert any("desync begins here" in n for n in names) and any("highlighted row" in n for n in names)


def test_output_card_says_position_and_token_ids_in_words(cli_trace: Path) -> None:
    trace = load_trace(cli_trace)
    html = outputs_html(RunOutputs("A", trace, check_trace(trace)))
    assert "first divergence at output position" in html and "output token id" in html
    assert "reference token id" in html and "first divergent token #" not in html


def test_heatmaps_give_every_sequence_a_labelled_row(cli_trace: Path) -> None:
    trace = load_trace(cli_trace)
    trace.sequences += [SequenceRecord(i, "p", [5], [], "", None, None, None) for i in range(len(trace.sequences), 12)]
    for fig in (acceptance_heatmap(trace), kv_heatmap(trace)):
        assert fig.layout.height >= ROW_PX * 12
        assert len(fig.layout.yaxis.tickvals) == 12  # every sequence labelled, none skipped
        assert fig.data[0].colorbar.nticks <= 6


def test_slot_summary_explains_the_fault(cli_trace: Path) -> None:
    text = slot_summary_markdown(analyse(load_trace(cli_trace), "cli"), "A")
    assert FAULT_DESCRIPTIONS["extra-accept"] in text and "docs/faults.md" in text
