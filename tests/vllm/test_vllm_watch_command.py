"""`specviz watch --out T -- python their_vllm_script.py`: the unmodified script, its engine core in
this process or in its own (vLLM's general plugin, this package's entry point, records there).
The user's script is tests/vllm/offline_script.py; it never imports specviz."""

import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest
from vllm_runs import BUDGETS, KV_BYTES, SCRIPT

from specviz.analysis.check import check_trace
from specviz.trace.io import load_trace


@pytest.fixture(scope="module")
def plugin_installed(vllm_installed):
    names = {e.value for e in entry_points(group="vllm.general_plugins")}
    if "specviz.watch.vllm.plugin:register" not in names:
        pytest.fail("specviz is not installed in this venv (pip install --no-deps -e .): vLLM cannot load its plugin")


@pytest.mark.parametrize("multiprocessing", ["1", "0"])
def test_watch_command_on_unmodified_script(plugin_installed, tmp_path, multiprocessing):
    out = tmp_path / "vllm.json.gz"
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING=multiprocessing, KV_BYTES=str(KV_BYTES))
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env.setdefault("OMP_NUM_THREADS", "1")
    done = subprocess.run(
        [sys.executable, "-m", "specviz", "watch", "--out", str(out), "--", "python", str(SCRIPT), "draft_model"],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "specviz watch: vLLM" in done.stderr
    trace = load_trace(out)
    report = check_trace(trace)
    assert report.violations == [] and report.verdict == "clean"
    assert [len(s.output_ids) for s in trace.sequences] == BUDGETS
    assert all(s.output_ids == s.reference_ids for s in trace.sequences)
    assert trace.header.proposer == "draft-model" and trace.header.draft_k == 3
