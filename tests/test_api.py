"""The public Python API: `specviz.watch` is a function, `check_trace` is exported, and the
invariant numbers and names of reports are the `Invariant` enum's."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import specviz
from specviz.analysis.check import check_trace
from specviz.trace.invariants import STATE_INVARIANTS, Invariant
from specviz.trace.io import load_trace

ROOT = Path(__file__).resolve().parent.parent


def test_watch_is_a_function_with_the_session_signature() -> None:
    from specviz.watch.session import watch as session_watch

    assert inspect.isfunction(specviz.watch)
    assert inspect.signature(specviz.watch) == inspect.signature(session_watch)
    assert "Watch `target`" in (specviz.watch.__doc__ or "")


def test_watch_stays_a_function_after_its_subpackage_is_imported() -> None:
    probe = (
        "import inspect, pydoc, specviz\n"
        "import specviz.watch.steps, specviz.watch.hooks\n"
        "from specviz.watch import Watch, WatchError, CallSink\n"
        "assert inspect.isfunction(specviz.watch), specviz.watch\n"
        "assert 'function watch' in pydoc.render_doc(specviz.watch)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_public_names() -> None:
    assert specviz.check_trace is check_trace
    assert specviz.Invariant is Invariant
    assert specviz.load_trace is load_trace
    for name in specviz.__all__:
        assert getattr(specviz, name) is not None


def test_invariant_numbers_and_slugs_are_the_reports() -> None:
    assert [(int(i), i.slug) for i in Invariant] == [
        (1, "rectangular-alignment"),
        (2, "position-contiguity"),
        (3, "kv-consistency"),
        (4, "token-accounting"),
        (5, "output-equivalence"),
        (6, "head-input"),  # schema 3: head drafting
        (7, "draft-input"),  # schema 4: a draft model's inputs
        (8, "sampling-state"),  # schema 4: the repetition penalty's history
    ]
    seen = set()
    for path in sorted((ROOT / "traces").glob("*.json.gz")):
        report = check_trace(load_trace(path))
        data = json.loads(json.dumps(report.to_dict()))
        for v, d in zip(report.violations, data["violations"]):
            assert isinstance(v.invariant, Invariant) and v.invariant in STATE_INVARIANTS
            assert type(d["invariant"]) is int and d["name"] == Invariant(d["invariant"]).slug == v.name
            seen.add(v.invariant)
    assert seen == set(STATE_INVARIANTS)  # the shipped fault traces break every state invariant
