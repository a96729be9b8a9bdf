"""A pytest plugin (loaded by tests/conftest.py): how many tests this session collected, kept in
the config's stash for `tests/test_doc_counts.py`, which compares a whole-suite run's count with
the one the docs state (docs/counts.json)."""

from __future__ import annotations

import pytest

COLLECTED = pytest.StashKey[int]()


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: the tests this session runs
def pytest_collection_modifyitems(session, config, items) -> None:
    config.stash[COLLECTED] = len(items)
