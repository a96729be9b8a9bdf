"""The README keeps its promises: it opens (after the Space's front matter) with exactly the two
setup commands, and its Python analysis example runs as written, on the public API only."""

from __future__ import annotations

import re
from pathlib import Path

import specviz
import specviz.trace

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SETUP = """```bash
pip install -r requirements.txt && python app.py
pip install -r requirements-dev.txt && python -m pytest -q
```"""


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)


def test_readme_opens_with_the_two_setup_commands() -> None:
    front, body = re.fullmatch(r"---\n(.*?)\n---\n\n(.*)", README, flags=re.DOTALL).groups()
    assert "sdk: gradio" in front and body.startswith(SETUP + "\n")


def test_the_analysis_example_runs_on_the_public_api(monkeypatch) -> None:
    block = next(b for b in python_blocks() if "check_trace" in b)
    imported = re.findall(r"^from (specviz(?:\.trace)?) import (.+)$", block, flags=re.MULTILINE)
    public = {"specviz": specviz.__all__, "specviz.trace": specviz.trace.__all__}
    assert imported and all(name.strip() in public[module] for module, names in imported for name in names.split(","))
    monkeypatch.chdir(ROOT)  # the example names a bundled trace by its path in the repository
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)  # noqa: S102 - the README's own example
    assert scope["report"].verdict == "desync" and scope["report"].first_violation is not None
    assert len(scope["frame"]) == sum(len(step.rows) for step in scope["trace"].steps)
