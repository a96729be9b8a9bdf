"""tools/count_rules.py counts every decision kind the watch's goal names, per ast node."""

from __future__ import annotations

from tools.count_rules import count, main

SOURCE = """
def f(a, b, xs):
    if a and b or not a:          # 1 if, 2 and/or operands past the first
        return [x for x in xs if x if x > 1]   # 2 filters
    elif b:                       # 1 if (elif)
        return a if b else None   # 1 conditional expression
    return any(x or a for x in xs)  # 1 and/or operand
"""


def test_each_kind_is_counted() -> None:
    assert count(SOURCE) == {"if/elif": 2, "ifexp": 1, "filters": 2, "and/or": 3}


def test_a_folder_is_counted_whole_less_what_is_excluded(tmp_path, capsys, monkeypatch) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text(SOURCE)
    (tmp_path / "pkg" / "sub" / "b.py").write_text("x = 1 if True else 2\n")
    monkeypatch.chdir(tmp_path)
    assert main(["pkg"]) == 0
    assert capsys.readouterr().out.strip().endswith("decisions 9")
    assert main(["pkg", "--exclude", "pkg/sub"]) == 0
    assert capsys.readouterr().out.strip().endswith("decisions 8")
