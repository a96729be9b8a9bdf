"""Issue 34: the local readers (`specviz check`, `convert`, `runs`, `app.py --trace`) are bounded by
a file's own declared sizes. A CI gate reads artifacts other jobs wrote: each hostile file below is
refused in one line naming the file (not its folders), with `--no-limits` for a trusted big run,
while a real trace of either container still reads. The peak RSS of each refusal (well under 2 GB)
is measured by `tools/attack_suite.py --only local`."""

from __future__ import annotations

from pathlib import Path

import pytest

from specviz.cli import main
from specviz.trace.budget import FILE_LIMITS, FileLimits, file_limits, json_parse_bytes, set_file_limits
from specviz.trace.io import TraceError, load_trace, open_trace, save_trace
from specviz.trace.synthetic import synthetic_trace
from tools.attacks.local_files import bad_row_group_file, dictionary_bomb_file, footer_bomb_file, json_bomb_file


@pytest.fixture
def small_limits() -> FileLimits:
    """Limits scaled down so the hostile files stay small and quick; the rules are the same."""
    limits = FileLimits(decode_floor=4 << 20, decode_ratio=20, json_bytes=4 << 20, parse_bytes=64 << 20)
    set_file_limits(limits)
    yield limits
    set_file_limits(FILE_LIMITS)


def _one_line(exc: pytest.ExceptionInfo, path: Path) -> str:
    message = str(exc.value)
    assert "\n" not in message and str(path.parent) not in message and path.name in message
    return message


def test_a_dictionary_page_expanding_past_the_file_is_refused(tmp_path: Path, small_limits: FileLimits) -> None:
    path = dictionary_bomb_file(tmp_path, rows=2_000, text_bytes=64 << 10)  # 128 MB of strings once read
    with pytest.raises(TraceError) as exc:
        open_trace(path)
    assert "strings expand to 125 MiB" in _one_line(exc, path) and "--no-limits" in str(exc.value)


def test_a_footer_parsing_past_the_file_is_refused(tmp_path: Path, small_limits: FileLimits) -> None:
    path = footer_bomb_file(tmp_path, objects=400_000)
    with pytest.raises(TraceError) as exc:
        open_trace(path)
    assert "footer" in _one_line(exc, path)


def test_a_gzip_json_trace_inflating_past_the_limit_is_refused(tmp_path: Path, small_limits: FileLimits) -> None:
    path = json_bomb_file(tmp_path, 8)
    with pytest.raises(TraceError) as exc:
        load_trace(path)
    assert "gzip inflating past the 4 MiB" in _one_line(exc, path)


def test_json_whose_parse_would_be_huge_is_refused_unparsed(tmp_path: Path, small_limits: FileLimits) -> None:
    path = tmp_path / "empty-objects.json"
    path.write_text('{"format":"specviz-trace","junk":[' + "{}," * 1_000_000 + "{}]}")  # 3 MB, ~100 MB parsed
    with pytest.raises(TraceError) as exc:
        load_trace(path)
    assert "parse would take" in _one_line(exc, path)
    assert json_parse_bytes("[1,2,3]") == 7 + 64 + 80


def test_a_damaged_row_group_names_the_file_only(tmp_path: Path) -> None:
    path = bad_row_group_file(tmp_path)
    with pytest.raises(TraceError) as exc:
        list(open_trace(path).steps)
    assert "not a readable Parquet file" in _one_line(exc, path)  # its strings' pages are read first


def test_real_traces_read_and_no_limits_lifts_the_bounds(tmp_path: Path, small_limits: FileLimits, capsys) -> None:
    trace = synthetic_trace(8, 4, 4, 16)
    for name in ("t.parquet", "t.json.gz", "t.json"):
        assert len(load_trace(save_trace(trace, tmp_path / name)).steps) == len(trace.steps)
    bomb = dictionary_bomb_file(tmp_path, rows=200, text_bytes=64 << 10)  # 12.5 MB once read: over 4 MiB
    assert main(["check", str(bomb)]) == 2
    assert "--no-limits" in capsys.readouterr().err
    assert main(["check", "--no-limits", str(bomb)]) == 2  # read whole, then refused by the row checks:
    err = capsys.readouterr().err
    assert "unknown reason 'xxxxx" in err and len(err) < 400  # the 64 KB string is cut in the message
    assert file_limits() is small_limits  # the flag lasts one command
