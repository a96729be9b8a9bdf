"""The CI skip rule (tests/support/ci_skips.py), run on a throwaway test file in a child pytest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent / "support"

DEMO = """
import pytest

def test_plain_skip():
    pytest.skip("no thing here")

@pytest.mark.skipif(True, reason="by a skipif marker")
def test_skipif():
    pass

@pytest.mark.allowed_skip(reason="by design")
def test_allowed_by_marker():
    pytest.skip("a reason by design")

@pytest.mark.skipif(True, reason="needs transformers 5")
def test_allowed_by_option():
    pass

@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False

def test_passes():
    pass
"""


MODULE = 'import pytest\npytest.importorskip("no_such_module_zz")\n\ndef test_never():\n    pass\n'


def outcomes(tmp_path: Path, ci: str | None, *args: str) -> tuple[dict[str, str], str]:
    """Per test of the demo file, its outcome word in `pytest -v`; and the whole output."""
    (tmp_path / "test_demo.py").write_text(DEMO)
    (tmp_path / "test_mod.py").write_text(MODULE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(SUPPORT)
    if ci is not None:
        env["CI"] = ci
    cmd = [sys.executable, "-m", "pytest", "-p", "ci_skips", "-p", "no:cacheprovider", "-v", "-rs", *args]
    cmd.append("--continue-on-collection-errors")
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120).stdout
    result = {}
    for line in out.splitlines():  # -v: "test_demo.py::test_passes PASSED  [ 16%]"
        if line.startswith("test_demo.py::"):
            name, word = line.split("::")[1].split()[:2]
            result.setdefault(name, word)  # a failed teardown would add a second line
    return result, out


def test_outside_ci_skips_stay_skips(tmp_path) -> None:
    got, out = outcomes(tmp_path, None)
    assert got == {
        "test_plain_skip": "SKIPPED",
        "test_skipif": "SKIPPED",
        "test_allowed_by_marker": "SKIPPED",
        "test_allowed_by_option": "SKIPPED",
        "test_xfail": "XFAIL",
        "test_passes": "PASSED",
    }
    assert "no_such_module_zz" in out and "skipped under CI" not in out and "error" not in out.lower()


def test_under_ci_unallowed_skips_fail(tmp_path) -> None:
    got, out = outcomes(tmp_path, "true", "--allow-skip", "needs transformers 5")
    assert got == {
        "test_plain_skip": "FAILED",
        "test_skipif": "ERROR",  # a skipif marker skips at setup: the failure is reported there
        "test_allowed_by_marker": "SKIPPED",
        "test_allowed_by_option": "SKIPPED",
        "test_xfail": "XFAIL",
        "test_passes": "PASSED",
    }
    # the module skipped at import (importorskip) is a collection error
    assert "ERROR collecting test_mod.py" in out and out.count("skipped under CI=true") == 3
