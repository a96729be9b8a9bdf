"""The views reconstruct what the engine fed, flag what differs from a correct engine, and stay
fast on large traces. Traces come from real runs of the tiny model pair (tests/support/tiny.py) and from
a synthetic, correct-by-construction 480-prompt trace.
"""

from __future__ import annotations

import copy
import random
import re

import numpy as np
import pytest

from specviz.analysis.check import check_trace
from specviz.analysis.metrics import acceptance
from specviz.analysis.slots import step_slots
from specviz.trace.schema import Header, ModelInfo, RowRecord, SequenceRecord, StepRecord, Trace
from specviz.views import (
    RunOutputs,
    acceptance_figure,
    acceptance_heatmap,
    analyse,
    compare_table,
    drift_heatmap,
    grid_figure,
    grid_view,
    kv_heatmap,
    outputs_html,
    sequence_table,
    summary_markdown,
    timeline_figure,
    violations_table,
)
from specviz.views.grid import NO_ROW, window_start
from specviz.views.grid_text import row_choices, row_details_markdown
from specviz.views.heatmaps import bin_matrix
from specviz.views.outputs import ordered_sequence_ids, page_count
from specviz.views.palette import FIRST_FLAG_COLOR
from specviz.views.run import NO_ROW_PICKED
from specviz.views.tokens import TOKEN_TEXT_KEY, token_label, token_texts

# ----------------------------------------------------------------------------- ragged grid
# (what each slot holds is tested in test_slots.py; here, how the grid draws and words it)


def test_grid_figure_windows_and_marks_first_violation(traces: dict[str, Trace]) -> None:
    loaded = analyse(traces["column-positions"], "t")
    grid = loaded.step_slots(loaded.start_step_index())
    fig = grid_figure(grid, loaded.texts, window=8, selected_row=grid.first_violation[0])
    heat = fig.data[0]
    assert len(heat.z[0]) == 8 + grid.query_len + 1 == len(fig.layout.xaxis.ticktext)
    assert any(s.line.color == FIRST_FLAG_COLOR and s.line.width == 4 for s in fig.layout.shapes)
    assert any("desync" in (a.text or "") for a in fig.layout.annotations)
    # The flagged row's label says so; the hover names the problem.
    assert any("✗" in label for label in fig.layout.yaxis.ticktext)
    assert any("expected" in h for row in heat.customdata for h in row)
    # A focus column left of the window widens it.
    assert window_start(grid, 8, focus_col=0) == 0
    assert window_start(grid, 8) == max(0, grid.cache_len - 8)


def test_row_details_compare_fed_and_expected(traces: dict[str, Trace]) -> None:
    loaded = analyse(traces["column-positions"], "t")
    first = loaded.report.first_violation
    grid = loaded.step_slots(first.step_index)
    text = row_details_markdown(grid, first.row, loaded.texts)
    assert "query positions" in text and "✗" in text
    assert row_details_markdown(grid, NO_ROW) == ""  # a row the step lacks has no details
    assert row_choices(grid)[0] == ("none", NO_ROW) and len(row_choices(grid)) == len(grid.rows) + 1


def test_grid_view_clamps_the_step_and_drops_a_row_the_step_lacks(traces: dict[str, Trace]) -> None:
    loaded = analyse(traces["column-positions"], "t")
    view = grid_view(loaded, 10_000, 99, None)
    assert view.step_index == loaded.step_count - 1 and view.row == NO_ROW
    assert view.row_text == NO_ROW_PICKED and view.step_text.startswith(f"Step {loaded.trace.steps[-1].step}")
    first = loaded.report.first_violation
    picked = grid_view(loaded, first.step_index, first.row, 8)
    assert picked.row == first.row and "▶" in " ".join(picked.figure.layout.yaxis.ticktext)
    empty = grid_view(None, 3, 1, 40)
    assert empty.row_choices == [("none", NO_ROW)] and "No run loaded" in empty.figure.layout.annotations[0].text


# ----------------------------------------------------------------------------- outputs


def test_outputs_highlight_the_first_divergent_token(traces: dict[str, Trace]) -> None:
    trace = traces["extra-accept"]
    report = check_trace(trace)
    diverged = [s for s in report.sequences if s.first_divergence is not None]
    assert diverged
    html = outputs_html(RunOutputs("A", trace, report), per_page=len(trace.sequences))
    for verdict in diverged:
        card = re.search(
            rf"<div class='sv-seq' data-seq='{verdict.seq_id}' data-verdict='(\w+)'>.*?(?=<div class='sv-seq'|$)",
            html,
            re.S,
        )
        assert card, verdict.seq_id
        output_col = card.group(0).split("data-role='output'")[1]
        marked = re.findall(r"data-index='(\d+)' data-divergent='true'", output_col)
        assert marked == [str(verdict.first_divergence)]
        reference_col = card.group(0).split("data-role='reference'")[1].split("data-role='output'")[0]
        assert re.search(rf"sv-refdiv' data-index='{verdict.first_divergence}'", reference_col)
        assert card.group(1) == verdict.verdict and verdict.verdict.upper() in card.group(0)


def test_outputs_order_pages_and_comparison(traces: dict[str, Trace]) -> None:
    faulty, correct = traces["stale-kv"], traces["eqspec"]
    report = check_trace(faulty)
    order = ordered_sequence_ids(report)
    diverged = {s.seq_id for s in report.sequences if s.first_divergence is not None}
    assert set(order[: len(diverged)]) == diverged  # divergent sequences come first
    assert page_count(report, per_page=4) == -(-len(trace_ids(faulty)) // 4)
    html = outputs_html(RunOutputs("A", faulty, report), RunOutputs("B", correct, check_trace(correct)), per_page=2)
    assert html.count("class='sv-seq'") == 2
    assert "run B: eqspec" in html  # same prompts: the correct run sits beside the faulty one


def trace_ids(trace: Trace) -> list[int]:
    return [s.seq_id for s in trace.sequences]


# ----------------------------------------------------------------------------- whole-run views


def test_heatmaps_show_errors_only_for_faulty_runs(traces: dict[str, Trace]) -> None:
    for name in ("eqspec", "exspec"):
        for fig in (kv_heatmap(traces[name]), drift_heatmap(traces[name])):
            z = np.asarray(fig.data[0].z, dtype=float)
            assert np.all(np.nan_to_num(z) == 0)
    assert np.nanmax(np.asarray(kv_heatmap(traces["stale-kv"]).data[0].z, dtype=float)) > 0
    assert np.nanmax(np.abs(np.asarray(drift_heatmap(traces["column-positions"]).data[0].z, dtype=float))) > 0


def test_acceptance_heatmap_holds_accepted_counts(traces: dict[str, Trace]) -> None:
    trace = traces["eqspec"]
    z = np.asarray(acceptance_heatmap(trace).data[0].z, dtype=float)
    for si, step in enumerate(trace.steps):
        for row in step.rows:
            assert z[row.seq_id, si] == row.accepted
    assert np.isnan(z).any()  # sequences not in a step's batch stay blank


def test_binning_caps_size_and_keeps_extremes(traces: dict[str, Trace]) -> None:
    trace = traces["stale-kv"]
    worst = max(r.kv_len - (r.committed_before - 1) for s in trace.steps for r in s.rows)
    binned = bin_matrix(trace, lambda r: r.kv_len - (r.committed_before - 1), "extreme", max_sequences=2, max_steps=3)
    assert binned.z.shape[0] <= 2 and binned.z.shape[1] <= 3 and binned.binned
    assert np.nanmax(binned.z) == worst


def test_acceptance_metrics_follow_the_definitions(traces: dict[str, Trace]) -> None:
    trace = traces["eqspec"]
    total, per_seq = acceptance(trace)
    fig = acceptance_figure(trace)
    assert list(fig.data[0].y) == pytest.approx(total.per_position)
    assert list(fig.data[1].y) == total.histogram
    assert list(fig.data[2].y) == pytest.approx(total.per_position_given_previous)
    table = sequence_table(trace, check_trace(trace))
    for _, line in table.iterrows():
        acc = per_seq[line["seq"]]
        assert line["acceptance rate"] == pytest.approx(acc.rate, abs=1e-3)
        assert line["verdict"] == "exact"


def test_timeline_and_table_start_at_the_first_violation(traces: dict[str, Trace]) -> None:
    trace = traces["masked-holes"]
    report = check_trace(trace)
    fig = timeline_figure(trace, report)
    star = [d for d in fig.data if d.marker.symbol == "star"]
    assert star and star[0].x[0] == report.first_violation.step
    table = violations_table(report)
    assert table.iloc[0]["step"] == report.first_violation.step and table.iloc[0]["row"] == report.first_violation.row
    clean = timeline_figure(traces["eqspec"], check_trace(traces["eqspec"]))
    assert not clean.data and "all invariants hold" in clean.layout.title.text


def test_summary_says_where_desync_begins(traces: dict[str, Trace]) -> None:
    trace = traces["stale-kv"]
    report = check_trace(trace)
    text = summary_markdown(trace, report, "A")
    first = report.first_violation
    assert "DESYNC" in text and f"Desync begins at step {first.step}, row {first.row}" in text
    assert "Incomplete" not in text
    trace.header.complete = False
    try:
        assert "Incomplete run" in summary_markdown(trace, report)
    finally:
        trace.header.complete = True
    clean = summary_markdown(traces["eqspec"], check_trace(traces["eqspec"]))
    assert "CLEAN" in clean and "Desync begins" not in clean
    table = compare_table([("A", trace, report), ("B", traces["eqspec"], check_trace(traces["eqspec"]))])
    assert list(table.columns) == ["metric", "run A", "run B"]
    assert table.set_index("metric").loc["verdict"].tolist() == ["desync", "clean"]


def test_summary_gives_the_range_of_per_sequence_budgets(traces: dict[str, Trace]) -> None:
    trace = copy.deepcopy(traces["eqspec"])
    report, n, most = check_trace(trace), len(trace.sequences), trace.header.max_new_tokens
    assert f"{n} prompts × {most} new tokens" in summary_markdown(trace, report)
    trace.header.options["sequence_budgets"] = {"1": 3}  # a watched engine's per-request budget
    assert f"{n} prompts × 3–{most} new tokens" in summary_markdown(trace, report)
    table = compare_table([("A", trace, report)]).set_index("metric")
    assert table.loc["prompts × new tokens"].tolist() == [f"{n} × 3–{most}"]


def test_token_text_travels_with_the_trace(traces: dict[str, Trace]) -> None:
    trace = traces["eqspec"]
    texts = token_texts(trace)
    assert texts and all(isinstance(v, str) for v in texts.values())
    assert set(trace.header.token_text) == {str(t) for t in texts}
    assert TOKEN_TEXT_KEY not in trace.header.options  # one place only
    assert token_label({}, 42) == "#42" and token_label({7: "a\nb"}, 7) == "a↵b"


# ----------------------------------------------------------------------------- large traces


def synthetic_trace(n_seqs: int, new_tokens: int, batch: int, k: int, prompt_len: int, seed: int = 0) -> Trace:
    """A correct eqspec-shaped trace built without models: each row accepts a random a_r per step."""
    rng = random.Random(seed)
    info = ModelInfo("synthetic", "float32", "cpu", 1000, 1)
    header = Header(1, "eqspec", None, info, info, k, batch, new_tokens, [], 0, 0, "2025-01-01T00:00:00+00:00", {})
    prompts = [[rng.randrange(3, 1000) for _ in range(prompt_len + rng.randrange(8))] for _ in range(n_seqs)]
    outputs: list[list[int]] = [[] for _ in range(n_seqs)]
    steps: list[StepRecord] = []
    for start in range(0, n_seqs, batch):
        active = list(range(start, min(start + batch, n_seqs)))
        while active:
            cache = max(len(prompts[s]) + len(outputs[s]) for s in active) - 1
            rows = []
            for r, s in enumerate(active):
                rows.append(_synthetic_row(rng, r, s, prompts[s] + outputs[s], cache, k, new_tokens - len(outputs[s])))
                outputs[s] += rows[-1].emitted
            steps.append(StepRecord(len(steps), start // batch, cache, k + 1, None, 1.0, 1.0, 1.0, 3.0, rows))
            active = [s for s in active if len(outputs[s]) < new_tokens]
    sequences = [
        SequenceRecord(
            i, f"prompt {i}", prompts[i], outputs[i], "", list(outputs[i]), [1.0] * len(outputs[i]), "length"
        )
        for i in range(n_seqs)
    ]
    return Trace(header, steps, sequences)


def _synthetic_row(rng: random.Random, r: int, s: int, tokens: list[int], cache: int, k: int, room: int) -> RowRecord:
    n = len(tokens)
    accepted = rng.randrange(k + 1)
    target = [rng.randrange(3, 1000) for _ in range(k + 1)]
    drafts = target[:accepted] + [t + 1 for t in target[accepted:k]]  # first mismatch at `accepted`
    emitted = (drafts[:accepted] + [target[accepted]])[:room]
    pad = cache - (n - 1)
    return RowRecord(
        row=r,
        seq_id=s,
        committed_before=n,
        left_pad=pad,
        left_pad_after=None,
        pending_token=tokens[-1],
        draft_tokens=drafts,
        target_tokens=target,
        accepted=accepted,
        bonus=target[accepted] if len(emitted) == accepted + 1 else None,
        emitted=emitted,
        write_seq=s,
        position_ids=list(range(n - 1, n + k)),
        mask_rle=[[0, pad], [1, cache - pad + k + 1]] if pad else [[1, cache + k + 1]],
        kv_len=n - 1,
        kv_len_expected=n - 1,
    )


def test_large_trace_heatmaps_are_binned() -> None:
    """480 prompts x 128 tokens at batch 16 (the issue's size): the heatmaps are binned, not one
    cell per token. Their speed is a benchmark (benchmarks/suite_timings.py), not a test."""
    trace = synthetic_trace(480, 128, 16, 4, prompt_len=120)
    for build in (acceptance_heatmap, kv_heatmap, drift_heatmap):
        z = np.asarray(build(trace).data[0].z)
        assert z.shape[0] <= 160 and z.shape[1] <= 240  # binned, not 480 x ~1900


def test_two_thousand_slot_cache_is_windowed() -> None:
    trace = synthetic_trace(4, 8, 4, 4, prompt_len=2000)
    grid = step_slots(trace, 0)
    assert grid.cache_len >= 2000
    fig = grid_figure(grid)
    assert len(fig.data[0].z[0]) == 40 + grid.query_len + 1
    assert "showing the last 40" in fig.layout.title.text


def test_outputs_without_token_text_fall_back_to_ids_and_recorded_text(traces: dict[str, Trace]) -> None:
    trace = copy.deepcopy(traces["extra-accept"])
    trace.header.token_text = {}
    seq = trace.sequences[0]
    html = outputs_html(RunOutputs("A", trace, check_trace(trace)), per_page=len(trace.sequences))
    assert f">#{seq.output_ids[0]}<" in html
    assert "class='sv-plain'" in html
