"""specviz's own engine (`python -m specviz record`) read through the command (`specviz watch --`,
nothing declared), against its own recorder's trace of the same run (issue 41, item 2).

EXSPEC regroups its rows by length, so a sequence sits out some verify calls and a later call
continues it: the command must keep it followable (`Seq.out`), never read it as having left the
batch and fold the tokens it emits when it comes back into the step before it sat out (a false
ACCOUNTING violation on a correct run). A fault the recorder locates is located by the command at
the same (step, sequence); the ones it cannot read so (WRONG) are never clean.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specviz.analysis.check import check_trace
from specviz.cli import main
from specviz.trace.io import load_trace

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _run(tmp: Path, method: str, fault: str | None, prompts: int = 3, tokens: int = 16):
    """The recorder's report and the command's, of one run of the engine under the command."""
    own, read = tmp / f"{method}-{fault}-{prompts}-{tokens}.json", tmp / f"cmd-{method}-{fault}-{prompts}-{tokens}.json"
    sizes = ["--num-prompts", str(prompts), "--batch-size", str(prompts), "--max-new-tokens", str(tokens)]
    record = ["python", "-m", "specviz", "record", "--method", method, *sizes, "--out", str(own)]
    record += ["--no-warm-up", "--no-reference", *(["--fault", fault] if fault else [])]
    main(["watch", "--out", str(read), "--", *record])
    return check_trace(load_trace(own)), check_trace(load_trace(read))


@pytest.mark.parametrize("method", ["eqspec", "exspec"])
@pytest.mark.parametrize(("prompts", "tokens"), [(3, 16), (4, 24)])
def test_a_correct_run_reads_clean_through_the_command(tmp_path: Path, method: str, prompts: int, tokens: int) -> None:
    """EXSPEC's sat-out sequences continue where they come back: no violation (it read desync at
    step 4, sequence 1, ACCOUNTING with 3 prompts and 16 tokens, before)."""
    own, read = _run(tmp_path, method, None, prompts, tokens)
    assert own.verdict == "clean"
    assert read.verdict == "clean" and not read.violations and read.unreadable is None, read.violations[:3]


# (fault, method, prompts): the recorder's default method for each; row-mixup fires only where
# EXSPEC regroups a batch of four.
FAULTS = [
    ("uniform-advance", "eqspec", 3),
    ("column-positions", "eqspec", 3),
    ("masked-holes", "eqspec", 3),  # at the recorder's (step, sequence); POSITIONS where it says ALIGNMENT
    ("stale-kv", "eqspec", 3),
    ("extra-accept", "eqspec", 3),
    ("missing-bonus-kv", "eqspec", 3),
    ("pad-accumulation", "eqspec", 3),
    ("row-mixup", "exspec", 4),
]
WRONG = {
    # Rows of one target call fit more than one sequence each (the padding grows alike): reading
    # stops there, unreadable with that reason, where the recorder locates (1, 0) POSITIONS.
    "pad-accumulation",
    # Results written to the next row's sequence: flagged ACCOUNTING at the recorder's step, at the
    # sequence whose tokens it received (the command follows the tokens), not the one it names.
    "row-mixup",
}


@pytest.mark.parametrize(("fault", "method", "prompts"), [f for f in FAULTS if f[0] not in WRONG])
def test_a_fault_is_located_where_the_recorder_locates_it(
    tmp_path: Path, fault: str, method: str, prompts: int
) -> None:
    own, read = _run(tmp_path, method, fault, prompts)
    assert own.first_violation is not None, "the fault did not fire"
    first = read.first_violation
    assert read.verdict != "clean" and first is not None, (read.verdict, read.unreadable)
    assert (first.step, first.seq_id) == (own.first_violation.step, own.first_violation.seq_id), read.violations[:3]


@pytest.mark.parametrize(("fault", "method", "prompts"), [f for f in FAULTS if f[0] in WRONG])
def test_a_fault_read_wrong_is_never_clean(tmp_path: Path, fault: str, method: str, prompts: int) -> None:
    own, read = _run(tmp_path, method, fault, prompts)
    assert own.first_violation is not None, "the fault did not fire"
    assert read.verdict != "clean", read.unreadable
    assert read.first_violation is not None or read.unreadable["why"]
