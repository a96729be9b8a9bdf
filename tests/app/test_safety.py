"""Issue 12: untrusted input costs what is shown. Budgets, bounded views, escaping, the CLI's --out
rules, Ctrl-C, umask, public mode and the live-run gate. The whole-app attacks (memory, time,
availability) are `tools/attack_suite.py --quick`; these are the parts testable in-process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specviz.analysis.slots import step_slots
from specviz.app.files import sweep_abandoned_uploads
from specviz.app.serve import LiveRunGate, public_mode, public_models_only
from specviz.cli import main
from specviz.data import load_prompts_file
from specviz.errors import PromptError, SpecvizError
from specviz.files import beside, check_output_path, umask_file_mode
from specviz.trace.budget import Budget, over_budget
from specviz.trace.io import TraceError, load_trace, parse_trace_bytes, save_trace, trace_to_dict
from specviz.trace.jsonparse import loads_yielding
from specviz.trace.mask_runs import mask_window
from specviz.trace.synthetic import synthetic_trace
from specviz.views.outputs import MAX_TOKENS_SHOWN, RunOutputs, outputs_html
from specviz.views.safe_text import html_text, md_text

ROOT = Path(__file__).resolve().parents[2]


def small() -> dict:
    return trace_to_dict(synthetic_trace(4, 2, 2, 6))


def refused(data: dict) -> str:
    with pytest.raises(TraceError) as error:
        parse_trace_bytes(json.dumps(data).encode(), "x.json")
    message = str(error.value)
    assert "\n" not in message
    return message


# ----------------------------------------------------------------------------- budget


def test_budget_refuses_what_a_file_declares_in_one_line() -> None:
    runs = small()
    runs["steps"][0]["rows"][0]["mask_rle"] = [[1, 10**7]] * 200
    assert "expanded mask length" in refused(runs)
    wide = small()
    wide["steps"][0]["query_len"] = 10**6
    assert "query_len" in refused(wide)
    drafts = small()
    drafts["header"]["draft_k"] = 10**6
    assert "draft_k" in refused(drafts)
    many = small()
    many["steps"] = many["steps"][:1] * 250_000  # references: the walk refuses before any step
    assert "step count" in over_budget(many)


def test_budget_passes_real_runs_and_counts_without_expanding() -> None:
    assert over_budget(trace_to_dict(synthetic_trace(120, 16, 4, 64))) is None
    data = small()
    data["steps"][0]["rows"][0]["mask_rle"] = [[1, 3]] * 5
    assert "run count" in over_budget(data, Budget(max_mask_runs_per_row=4))
    assert over_budget([1, 2]) is None  # not a trace: the converter says so, with a better message


def test_a_huge_cache_builds_only_the_window() -> None:
    data = small()
    for step in data["steps"]:
        step["cache_len"] = 10**6
    trace = parse_trace_bytes(json.dumps(data).encode())
    slots = step_slots(trace, 0)
    row = slots.rows[0]  # a window is built, not a million slots (the bound below, not a timing)
    assert len(row.slots) == slots.width and len(row.slots.built) <= 4096 + slots.query_len + 1
    assert row.slots[0].kind == "empty" and row.slots[slots.width - 1].col == slots.width - 1


def test_mask_window_clips_before_expanding() -> None:
    assert mask_window([[0, 2], [1, 10**9]], 1, 4) == [0, 1, 1]
    assert mask_window([[1, 2]], 0, 4) == [1, 1, None, None]


def test_outputs_page_is_bounded() -> None:
    from specviz.analysis.check import check_trace

    trace = synthetic_trace(2, 2, 2, 6)
    trace.sequences[0].output_ids = [5] * 200_000
    html = outputs_html(RunOutputs("A", trace, check_trace(trace)))
    assert html.count("class='sv-tok") <= 2 * (MAX_TOKENS_SHOWN + 2) * 2 and len(html) < 2_000_000


# ----------------------------------------------------------------------------- parsing and escaping


@pytest.mark.parametrize(
    "text",
    ['{"a":[1,{"b":[2]}],"c":"x"}', '{"a":[1,]}', '{"a" 1}', "[1]", '{"a":1} x', ""]
    # Objects member by member (the header, its piece table), plain members in one match.
    + ['{"h":{"t":{"1":"x", "2" : "y","1":"z"}},"s":[1]}', '{"h":{"a":"b",}}', '{"h":{"a":"b" "c":"d"}}']
    + ['{"h":{"a":"b\\n","c":"d"}}', '{"h":{"a":"b\x01","c":"d"}}', '{"h":{"a":"b\\q","c":"d"}}', '{"h":{"a":"b",']
    + ['{"h":{"a":"b","c":{"d":"e","f":[1]}}}', '{"h":{"a":"b",1:"c"}}', '{"h":{"a":"b","c":NaN}}'],
)
def test_item_by_item_parse_is_json_loads(text: str) -> None:
    def outcome(parse):  # noqa: ANN001, ANN202
        try:
            return parse(text)
        except json.JSONDecodeError as exc:
            return (exc.msg, exc.lineno, exc.colno)

    assert outcome(loads_yielding) == outcome(json.loads)


def test_trace_strings_are_escaped() -> None:
    from specviz.views import analyse, slot_summary_markdown

    data = small()
    data["header"]["method"] = "<img src=x>"
    data["header"]["target"]["name"] = "[a](javascript:alert(1))"
    loaded = analyse(parse_trace_bytes(json.dumps(data).encode()), "upload <b>x</b>.json")
    text = slot_summary_markdown(loaded, "A")
    assert "<img" not in text and "&lt;img src=x&gt;" in text
    assert "<b>x" not in text and "\\[a\\]" in text
    assert html_text("<a href=x>\n") == "&lt;a href=x&gt;" and md_text("a*b_c") == "a\\*b\\_c"


# ----------------------------------------------------------------------------- files and the CLI


def test_non_regular_inputs_are_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/proc/self/environ"), Path("/dev/null"), tmp_path):
        with pytest.raises(TraceError):
            load_trace(path)
        with pytest.raises(PromptError):
            load_prompts_file(path)


def test_deeply_nested_prompts_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("[" * 100_000 + "\n")
    assert main(["record", "--prompts", str(prompts), "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "nested too deeply" in err and err.count("\n") == 1


def test_out_is_checked_before_compute(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a regular file"):
        check_output_path(Path("/dev/full"), force=True)
    with pytest.raises(ValueError, match="exists"):
        check_output_path(Path(__file__), force=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="cannot create"):
        check_output_path(tmp_path / "file" / "sub" / "t.json", force=False)
    check_output_path(tmp_path / "new" / "t.json.gz", force=False)
    assert (tmp_path / "new").is_dir() and not list((tmp_path / "new").iterdir())  # the probe is gone


def test_record_refuses_a_device_before_loading_anything(capsys: pytest.CaptureFixture) -> None:
    assert main(["record", "--num-prompts", "1", "--out", "/dev/full", "--force"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert Path("/dev/full").is_char_device()


def test_saved_traces_follow_the_umask_and_never_replace_devices(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        path = save_trace(synthetic_trace(2, 2, 2, 4), tmp_path / "t.json.gz")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o640
    assert umask_file_mode() == 0o666 & ~old
    with pytest.raises(TraceError, match="not a regular file"):
        save_trace(synthetic_trace(2, 2, 2, 4), "/dev/null")


def test_a_smaller_run_is_written_beside_a_complete_trace(tmp_path: Path) -> None:
    from specviz.recording import _keep_complete

    out = save_trace(synthetic_trace(4, 2, 2, 8), tmp_path / "run.json.gz")
    partial = synthetic_trace(2, 2, 2, 2)
    partial.header.complete = False
    kept = _keep_complete(out, partial)
    assert kept != out and kept.parent == out.parent and kept.name.startswith("run.partial-")
    assert beside(out, "new").name.endswith(".json.gz")
    bigger = synthetic_trace(8, 2, 2, 16)
    assert _keep_complete(out, bigger) == out


def _wait_until_mapped(proc: subprocess.Popen, library: str, timeout_s: float = 60) -> None:
    """Until the child has `library` mapped (it is importing it), read from /proc: a condition,
    not a sleep."""
    maps = Path(f"/proc/{proc.pid}/maps")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if library in maps.read_text():
                return
        except OSError:
            pass
        time.sleep(0.005)
    raise AssertionError(f"the child never mapped {library}")


def test_ctrl_c_while_starting_exits_130_quietly(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "specviz", "record", "--num-prompts", "1", "--out", str(tmp_path / "t.json")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_until_mapped(proc, "libtorch")  # mid start-up: torch is being imported
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-400:]
    assert "Traceback" not in err and "interrupted" in err


def test_check_of_a_kernel_file_does_not_hang(capsys: pytest.CaptureFixture) -> None:
    assert main(["check", "/proc/kmsg"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# ----------------------------------------------------------------------------- public mode and the gate


def test_public_mode_and_its_model_rule() -> None:
    assert public_mode([], {"SPACE_ID": "user/space"}) and public_mode(["--public"], {})
    assert not public_mode([], {})
    bundled = ("/srv/target", "/srv/draft")
    public_models_only("", "", bundled)
    public_models_only("/srv/target", "/srv/draft", bundled)
    messages = set()
    for path in ("/etc", "/nonexistent", "gpt2"):
        with pytest.raises(SpecvizError) as error:
            public_models_only(path, "", bundled)
        messages.add(str(error.value))
    assert len(messages) == 1  # the answer says nothing about the path


def test_gate_admits_one_live_run_per_visitor() -> None:
    gate = LiveRunGate(max_pending=2)
    assert gate.admit("a") is None
    assert "already have" in gate.admit("a")
    assert gate.admit("b") is None
    assert "busy" in gate.admit("c")
    gate.done("a")
    assert gate.admit("c") is None and gate.pending() == 2


def test_gate_drops_a_run_that_left_the_queue_without_its_handler() -> None:
    """Gradio refused a run's inputs before its handler ran (which would release the mark): once
    the event is out of Gradio's queue, the visitor may run again; while it is in, they may not."""
    queued: set[str] = set()
    gate = LiveRunGate(max_pending=1, alive=queued.__contains__)
    assert gate.admit("a") is None
    gate.queued("a", "event-1")
    queued.add("event-1")
    assert "already have" in gate.admit("a") and "busy" in gate.admit("b")
    queued.discard("event-1")  # Gradio finished the event; the handler never ran
    assert gate.admit("b") is None and gate.pending() == 1
    assert gate.admit("a") is not None  # b's run (not yet queued) holds the only place


def test_sweeper_deletes_only_old_top_level_temp_files(tmp_path: Path) -> None:
    """A refused upload's empty tmp* file goes after a while; accepted uploads (in their own
    folders), fresh temp files and other names stay."""
    old_time = time.time() - 3600
    abandoned = tmp_path / "tmpabc123"
    abandoned.write_bytes(b"")
    fresh = tmp_path / "tmpfresh"
    fresh.write_bytes(b"")
    kept_folder = tmp_path / "0af89254d1e0"
    kept_folder.mkdir()
    (kept_folder / "trace.json.gz").write_bytes(b"x")
    other = tmp_path / "notes.txt"
    other.write_text("mine")
    for path in (abandoned, kept_folder, kept_folder / "trace.json.gz", other):
        os.utime(path, (old_time, old_time))
    assert sweep_abandoned_uploads(tmp_path, min_age_s=300) == 1
    assert not abandoned.exists()
    assert fresh.exists() and (kept_folder / "trace.json.gz").exists() and other.exists()
    assert sweep_abandoned_uploads(tmp_path / "missing") == 0
