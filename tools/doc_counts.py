"""The counts the docs state, generated from the code: `python -m tools.doc_counts` (CI: `.ci/run`).

A count in README.md or docs/*.md (faults, invariants, methods, proposers, the tests collected,
the suite's time on CI) sits in a marker, `<!-- count:faults -->15<!-- /count -->`, which this
rewrites from the code; `docs/counts.json` keeps every value with the date and the command. The
suite's time comes from CI (`--suite-seconds S`, the wall time of the run it just made); without
it the last one stays. `tests/test_doc_counts.py` fails when a marker or counts.json disagrees
with the code, or when a count of these sits in the docs outside a marker.

    python -m tools.doc_counts                      # rewrite counts.json and the markers
    python -m tools.doc_counts --suite-seconds 212  # also the suite's wall time (CI, after pytest)
    python -m tools.doc_counts --check              # exit 1 if anything would change
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COUNTS_FILE = ROOT / "docs" / "counts.json"
MARKER = re.compile(r"<!-- count:(?P<name>[a-z_]+) -->(?P<value>.*?)<!-- /count -->")
COLLECT_COMMAND = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0"]


def documents() -> list[Path]:
    """Every file whose counts are generated: the README and the guides."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def code_counts() -> dict[str, int]:
    """What the code has, read from the code itself (no run, no collection)."""
    from specviz.engine.faults import FAULTS
    from specviz.proposers import REGISTRY
    from specviz.trace.invariants import Invariant
    from specviz.trace.schema import METHODS

    return {"faults": len(FAULTS), "invariants": len(Invariant), "methods": len(METHODS), "proposers": len(REGISTRY)}


def collected_tests() -> int:
    """The tests `python -m pytest` collects (the whole suite, as CI runs it)."""
    out = subprocess.run(COLLECT_COMMAND, cwd=ROOT, capture_output=True, text=True, check=False).stdout
    found = re.search(r"^(\d+) tests? collected", out, re.MULTILINE)
    if found is None:
        raise SystemExit(f"could not count the tests: {' '.join(COLLECT_COMMAND[1:])} said {out[-300:]!r}")
    return int(found.group(1))


def minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def shown(counts: dict, name: str) -> str:
    """How marker `name` reads in prose: thousands with a comma; `suite_KEY` is the timed run's KEY,
    and `suite_time` its wall time as m:ss. A name counts.json lacks is a KeyError."""
    if name.startswith("suite_"):
        key = name.removeprefix("suite_")
        value = minutes(counts["suite"]["seconds"]) if key == "time" else counts["suite"][key]
    else:
        value = counts[name]
    return f"{value:,}" if isinstance(value, int) else str(value)


def rewrite(text: str, counts: dict) -> str:
    """`text` with every marker's value set from `counts` (an unknown name is an error, not skipped)."""

    def value(match: re.Match[str]) -> str:
        name = match.group("name")
        try:
            return f"<!-- count:{name} -->{shown(counts, name)}<!-- /count -->"
        except (KeyError, TypeError):
            raise SystemExit(f"unknown count marker {name!r}; counts.json has {', '.join(sorted(counts))}") from None

    return MARKER.sub(value, text)


def fresh_counts(previous: dict, suite_seconds: float | None) -> dict:
    counts: dict = {
        "command": "python -m tools.doc_counts",
        "date": dt.date.today().isoformat(),
        **code_counts(),
        "tests": collected_tests(),
        "suite": previous.get("suite"),
    }
    if suite_seconds is not None:
        counts["suite"] = {
            "seconds": round(suite_seconds),
            "date": counts["date"],
            "command": "python -m pytest -q",
            "cores": os.cpu_count(),
            "tests": counts["tests"],
        }
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite-seconds", type=float, default=None, help="the suite's wall time just measured")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    args = parser.parse_args(argv)
    previous = json.loads(COUNTS_FILE.read_text()) if COUNTS_FILE.exists() else {}
    counts = fresh_counts(previous, args.suite_seconds)
    if args.check:  # the date alone changing is not staleness
        counts["date"] = previous.get("date", counts["date"])
    outputs = {COUNTS_FILE: json.dumps(counts, indent=1) + "\n"}
    outputs.update({path: rewrite(path.read_text(encoding="utf-8"), counts) for path in documents()})
    stale = [path for path, text in outputs.items() if not path.exists() or path.read_text(encoding="utf-8") != text]
    for path in stale:
        print(f"{'stale' if args.check else 'rewrote'}: {path.relative_to(ROOT)}")
        if not args.check:
            path.write_text(outputs[path], encoding="utf-8")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
