"""No module of specviz, its tools or the app is over 400 lines (issue 44): a module that grows
past it is split where its concepts part, not trimmed to fit."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 400


def test_no_module_is_over_400_lines() -> None:
    files = [*ROOT.joinpath("specviz").rglob("*.py"), *ROOT.joinpath("tools").rglob("*.py"), ROOT / "app.py"]
    lines = {str(f.relative_to(ROOT)): len(f.read_text(encoding="utf-8").splitlines()) for f in files}
    over = {name: n for name, n in lines.items() if n > LIMIT}
    assert not over, f"split these where their concepts part: {over}"
