"""A pytest plugin (loaded by tests/conftest.py): under CI=true a skipped test is a failure.

Issue 26: CI passed with the browser tests quietly skipped when Chromium failed to install. A skip
stays a skip only where it is allowed by design: the test carries
`@pytest.mark.allowed_skip(reason=...)`, or its skip reason contains a `--allow-skip TEXT` given on
the command line (.ci/watch-compat allows the transformers-5-only tests that way). xfail is not a
skip. Outside CI (no CI=true) nothing changes.
"""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--allow-skip",
        action="append",
        default=[],
        metavar="TEXT",
        help="under CI=true, skips whose reason contains TEXT stay skips (by design); others fail",
    )


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "allowed_skip(reason): this test may skip under CI=true (by design, for the given reason)"
    )


def skips_fail() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _allowed(config, reason: str, item=None) -> bool:
    if item is not None and item.get_closest_marker("allowed_skip") is not None:
        return True
    return any(text in reason for text in config.getoption("allow_skip"))


def _fail_skip(report, reason: str) -> None:
    report.outcome = "failed"
    report.longrepr = (
        f"skipped under CI=true: {reason}\n"
        "A test that should run in CI was skipped. Fix the environment, or mark the skip as allowed by "
        "design (@pytest.mark.allowed_skip(reason=...) or --allow-skip TEXT)."
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (skips_fail() and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if not _allowed(item.config, reason, item):
        _fail_skip(report, reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A whole module skipped at import (`pytest.importorskip`) is a failure under CI too."""
    outcome = yield
    report = outcome.get_result()
    if skips_fail() and report.skipped:
        reason = _skip_reason(report)
        if not _allowed(collector.config, reason):
            _fail_skip(report, reason)
