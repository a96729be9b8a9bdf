"""Issue 36 without a browser: the slot pickers and labels, the A vs B prompts note, the report,
the Perfetto export, the link state, the cell details and the messages."""

from __future__ import annotations

import pytest

from specviz.app import loading
from specviz.views import slot_summary_markdown
from specviz.views.summary import compare_table

CLEAN = "default-eqspec.json.gz"
FAULTY = "default-eqspec-column-positions.json.gz"
GEMMA = "gemma-eqspec.json.gz"


@pytest.fixture
def local_a() -> object:
    loaded = loading.open_local_a(loading.TRACES / FAULTY)
    yield loaded
    loading.LOCAL_A.clear()


def test_the_trace_run_is_slot_a_pick_and_examples_say_so(local_a: object) -> None:
    choices = loading.slot_choices("A")
    assert choices[0] == (f"{FAULTY} (your --trace file)", loading.LOCAL_CHOICE)
    assert loading.load_bundled(loading.LOCAL_CHOICE) is local_a  # picked back: the same run
    assert loading.slot_choices("B") == loading.bundled_traces()  # B never offers A's file
    assert "bundled example" not in slot_summary_markdown(local_a, "A")
    assert "Run B (bundled example)" in slot_summary_markdown(loading.load_bundled(CLEAN), "B")


def test_a_vs_b_says_when_the_runs_share_no_prompts() -> None:
    runs = {name: loading.load_bundled(name) for name in (CLEAN, FAULTY, GEMMA)}

    def prompts_row(a: str, b: str) -> list[str]:
        pairs = [(label, runs[n].trace, runs[n].report) for label, n in (("A", a), ("B", b))]
        return compare_table(pairs).set_index("metric").loc["prompts in common"].tolist()

    count = len(runs[CLEAN].trace.sequences)
    assert prompts_row(CLEAN, FAULTY) == [f"{count} of {count}"] * 2
    assert all(cell.startswith("none: different prompts") for cell in prompts_row(FAULTY, GEMMA))
