"""The counts the docs state agree with the code: every count of faults, invariants, methods,
proposers and tests in README.md and docs/*.md is a generated marker (`tools/doc_counts.py`), each
marker says what `docs/counts.json` says, counts.json says what the code has, and a whole-suite
run collects as many tests as it says. A count written by hand in prose, outside a marker, fails.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from suite_size import COLLECTED

from tools import doc_counts

ROOT = Path(__file__).resolve().parents[1]
COUNTS = json.loads(doc_counts.COUNTS_FILE.read_text())
NUMBER = (
    r"\d[\d,]*|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
    r"sixteen|seventeen|eighteen|nineteen|twenty"
)
# "15 named faults", "six invariants", "1,617 tests": a total the code decides. A qualified count
# ("all four corrupting faults", "22 tests fail") is not matched unless it is one of these forms.
HAND_COUNT = re.compile(
    rf"(?<![\w-])({NUMBER})\s+(named\s+|known\s+|injectable\s+)?(faults|invariants|proposers|tests)\b(?!\s+fail)",
    re.IGNORECASE,
)
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b")  # a measurement log names its day (and its command)


def prose(path: Path) -> str:
    """The document's paragraphs without markers, code blocks and emphasis, dated ones left out
    (a dated measurement keeps the count it measured)."""
    text = doc_counts.MARKER.sub("", path.read_text(encoding="utf-8"))
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    paragraphs = re.split(r"\n\s*\n", re.sub(r"[*_`]", "", text))
    return "\n\n".join(p for p in paragraphs if not DATED.search(p))


def test_counts_file_says_what_the_code_has() -> None:
    assert {name: COUNTS[name] for name in doc_counts.code_counts()} == doc_counts.code_counts()


@pytest.mark.parametrize("path", doc_counts.documents(), ids=lambda p: p.name)
def test_every_marker_shows_the_generated_count(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert doc_counts.rewrite(text, COUNTS) == text, f"{path.name} is stale: run python -m tools.doc_counts"


@pytest.mark.parametrize("path", doc_counts.documents(), ids=lambda p: p.name)
def test_no_count_is_written_by_hand(path: Path) -> None:
    found = [m.group(0) for m in HAND_COUNT.finditer(prose(path))]
    assert not found, f"{path.name}: {found}: put each in a marker, <!-- count:NAME -->N<!-- /count -->"


def test_the_hand_count_rule_catches_the_forms_that_went_stale() -> None:
    """The README said "ten named faults" while 15 existed, and testing.md "1,260 tests"."""
    for stale in ("plus ten named faults that", "(1,260 tests on 2 idle cores", "the six invariants"):
        assert HAND_COUNT.search(stale), stale
    for fine in ("all four corrupting faults", "22 tests fail", "the slot-2 tests", "two methods are wrapped"):
        assert not HAND_COUNT.search(fine), fine


@pytest.mark.allowed_skip(reason="only a whole-suite run knows the suite's size")
def test_counts_file_names_as_many_tests_as_the_suite_collects(request: pytest.FixtureRequest) -> None:
    config = request.config
    whole = [(config.invocation_params.dir / a).resolve() for a in config.args] in ([ROOT / "tests"], [ROOT])
    if not whole or config.option.keyword or config.option.markexpr:
        pytest.skip("only a whole-suite run knows the suite's size")
    assert config.stash[COLLECTED] == COUNTS["tests"], "docs/counts.json is stale: run python -m tools.doc_counts"
