"""The record command end to end on tiny model directories, bad input, and interruption."""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import save_tiny_model_dirs

from specviz.analysis.check import check_trace
from specviz.cli import main
from specviz.trace.io import load_trace

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def other_vocab_draft(tmp_path_factory):
    return save_tiny_model_dirs(tmp_path_factory.mktemp("other"), corpus_shift=3)[1]


def test_record_json_summary_and_trace(tiny_model_dirs, tmp_path, capsys) -> None:
    target, draft = tiny_model_dirs
    out = tmp_path / "run.json.gz"
    code = main(
        [
            "record",
            "--method",
            "eqspec",
            "--target",
            target,
            "--draft",
            draft,
            "--batch-size",
            "3",
            "--draft-k",
            "3",
            "--max-new-tokens",
            "8",
            "--num-prompts",
            "5",
            "--json",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    for key in (
        "method",
        "num_prompts",
        "exact_match",
        "acceptance_rate",
        "mean_acceptance_length",
        "tokens_per_second",
        "first_divergence",
    ):
        assert key in summary
    assert summary["exact_match"] == 1.0 and summary["num_prompts"] == 5
    assert summary["first_divergence"] == [None] * 5
    trace = load_trace(out)
    assert trace.header.complete and check_trace(trace).verdict == "clean"
    # never silently overwrite a user's trace
    assert main(["record", "--target", target, "--draft", draft, "--num-prompts", "1", "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err


def test_different_vocabularies_are_refused_before_compute(
    tiny_model_dirs, other_vocab_draft, tmp_path, capsys, monkeypatch
) -> None:
    """Refused after reading the tokenizers, before any weights load (not a wall-time bound)."""
    import specviz.engine.models as models

    def no_weights(*args, **kwargs):
        raise AssertionError("weights loaded before the vocabularies were compared")

    monkeypatch.setattr(models, "load_causal_lm", no_weights)
    target, _ = tiny_model_dirs
    code = main(
        [
            "record",
            "--target",
            target,
            "--draft",
            other_vocab_draft,
            "--num-prompts",
            "2",
            "--out",
            str(tmp_path / "x.json"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "different vocabularies" in err and err.count("\n") == 1
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--target", "/no/such/model"], "no such model directory"),
        (["--prompts", "/no/such/prompts.jsonl"], "no such prompts file"),
        (["--batch-size", "0"], "--batch-size"),
        (["--method", "baseline", "--fault", "stale-kv"], "faults corrupt speculative methods"),
        (["--method", "nonsense"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle, tmp_path, capsys) -> None:
    if needle == "invalid choice":
        with pytest.raises(SystemExit) as exc:
            main(["record", *args])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1
        return
    count = [] if "--prompts" in args else ["--num-prompts", "1"]
    assert main(["record", *args, *count, "--out", str(tmp_path / "y.json")]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_sigterm_leaves_a_valid_incomplete_trace(tiny_model_dirs, tmp_path) -> None:
    target, draft = tiny_model_dirs
    out = tmp_path / "partial.json.gz"
    cmd = [
        sys.executable,
        "-m",
        "specviz",
        "record",
        "--target",
        target,
        "--draft",
        draft,
        "--no-reference",
        "--batch-size",
        "2",
        "--draft-k",
        "2",
        "--max-new-tokens",
        "200",
        "--num-prompts",
        "40",
        "--out",
        str(out),
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Handshake, not a sleep: the decode bar (drawn once the SIGTERM handler is installed and
    # decoding has begun) shows >= 8 tokens emitted, so at least two steps (<= 6 tokens each at
    # batch 2, k 2) ran and the first is recorded. A stalled child fails by the communicate timeout.
    progress = ""
    while not any(int(n) >= 8 for n in re.findall(r"decode:.*?\|\s*(\d+)/\d+", progress)):
        chunk = proc.stderr.read(64)
        assert chunk, "the child exited before decoding: " + progress[-500:]
        progress += chunk
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-500:]
    trace = load_trace(out)
    assert not trace.header.complete
    assert trace.steps, "finished steps are kept"
    assert any(s.finish_reason is None for s in trace.sequences)
    assert "interrupted" in err
    report = check_trace(trace)
    assert report.violation_count == 0  # a partial trace is still a consistent trace


def _malformed_files(root: Path) -> dict[str, Path]:
    import gzip

    from specviz.trace.io import trace_to_json
    from specviz.trace.synthetic import synthetic_trace

    good = trace_to_json(synthetic_trace(4, 2, 2, 6))
    files = {
        "empty": b"",
        "not json": b"{trace?",
        "truncated gzip": gzip.compress(good.encode())[:100],
        "non-utf8": b"\xff\xfe\x00garbage",
        "nan": good.replace('"verify_ms":1.0', '"verify_ms":NaN', 1).encode(),
        "wrong type": good.replace('"draft_k":2', '"draft_k":"2"', 1).encode(),
        "extra field": good.replace('"draft_k":2', '"draft_k":2,"surprise":1', 1).encode(),
        "negative length": good.replace('"cache_len":', '"cache_len":-5,"x":', 1).encode(),
        "newer version": re.sub(r'"schema_version":\d+', '"schema_version":99', good, count=1).encode(),
        "bomb": gzip.compress(b" " * (300 * 1024 * 1024), compresslevel=1),  # same bytes inflated; 2.5 s less
        "a png": b"\x89PNG\r\n\x1a\n" + b"\x00" * 64,
    }
    paths = {}
    for name, data in files.items():
        path = root / (name.replace(" ", "_") + ".json")
        path.write_bytes(data)
        paths[name] = path
    paths["a directory"] = root
    return paths


def test_check_refuses_every_malformed_file_with_one_line(tmp_path, capsys) -> None:
    for name, path in _malformed_files(tmp_path).items():
        assert main(["check", str(path)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("specviz: error:") and err.count("\n") == 1, (name, err)
        assert "Traceback" not in err


def test_check_and_import_stay_light_without_torch() -> None:
    """`import specviz`, `specviz check` on a trace and `specviz runs` on a folder of them import
    no torch (a second, not 200 MB, per call)."""
    probe = (
        "import sys, specviz\n"
        "assert 'torch' not in sys.modules, 'import specviz pulled in torch'\n"
        "assert callable(specviz.watch)\n"
        "from specviz.cli import main\n"
        f"status = main(['check', {str(ROOT / 'traces' / 'default-eqspec.json.gz')!r}])\n"
        f"status += main(['runs', {str(ROOT / 'traces')!r}])\n"
        "import os\n"
        "print('torch' in sys.modules, status, os.environ.get('MIMALLOC_ARENA_EAGER_COMMIT'))\n"
    )
    # specviz sets Arrow's allocator to commit lazily before pyarrow loads (specviz.startup): not inherited here.
    env = {k: v for k, v in os.environ.items() if k != "MIMALLOC_ARENA_EAGER_COMMIT"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False 0 0"


def test_keep_freed_memory_is_glibc_only_and_can_be_turned_off() -> None:
    """record and bench keep freed blocks for reuse (fewer page faults per step); the env var
    turns it off, and a process without glibc's mallopt is left alone. Run in a child: the
    setting lasts for the process."""
    probe = (
        "import os, sys\n"
        "from specviz.allocator import keep_freed_memory\n"
        "print(keep_freed_memory())\n"
        "os.environ['SPECVIZ_KEEP_FREED_MEMORY'] = '0'\n"
        "print(keep_freed_memory())\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.split()
    assert second == "False"
    # glibc takes the settings; other C libraries (musl, macOS) have no mallopt: False, not an error
    assert first == ("True" if platform.libc_ver()[0] == "glibc" else "False")
