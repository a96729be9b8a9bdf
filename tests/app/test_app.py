"""The Gradio app through its public API (gradio_client), launched in-process: bundled traces,
uploads and live runs load with the right verdict and figures; bad input is a clear error that
leaves the loaded runs in place.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from tiny import make_pair

import app
from specviz.app import live, loading
from specviz.engine.run import RunConfig, run
from specviz.errors import SpecvizError
from specviz.trace.io import load_trace, save_trace
from specviz.trace.token_text import attach_token_text

ROOT = Path(__file__).resolve().parents[2]


class AppClient:
    """The app through gradio_client, each endpoint's values keyed by their component's elem_id.

    gradio_client returns an endpoint's values in the order of its outputs, leaving out the ones
    with no API value (gr.State, layout blocks); the demo says which component each one is.
    """

    def __init__(self, demo: Any, url: str) -> None:
        self.demo = demo
        self.client = Client(url, verbose=False)

    def output_ids(self, api_name: str) -> list[str]:
        fn = next(f for f in self.demo.fns.values() if f.api_name == api_name)
        ids = [component.elem_id for component in fn.outputs if not component.skip_api]
        assert all(ids) and len(set(ids)) == len(ids), f"{api_name}: outputs need distinct elem_ids, got {ids}"
        return ids

    def call(self, api_name: str, *args: Any) -> dict[str, Any]:
        values = self.client.predict(*args, api_name=f"/{api_name}")
        ids = self.output_ids(api_name)
        values = values if len(ids) > 1 else (values,)
        assert len(values) == len(ids), (api_name, ids)
        return dict(zip(ids, values))


@pytest.fixture(scope="module")
def client() -> Any:
    demo = app.build_app()
    _, url, _ = app.launch(demo, prevent_thread_lock=True, server_name="127.0.0.1", quiet=True)
    try:
        yield AppClient(demo, url)
    finally:
        demo.close()


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pair = make_pair("llama")
    trace = run(pair, ["hello", "a longer prompt", "xy"], RunConfig(batch_size=2, draft_k=3, max_new_tokens=8))
    attach_token_text(trace, pair.tokenizer)
    return save_trace(trace, tmp_path_factory.mktemp("upload") / "tiny-eqspec.json.gz")


def shown(value: Any) -> Any:
    """A component's value whether the endpoint sent it plain or as an update (value + visibility)."""
    return value.get("value") if isinstance(value, dict) and "__type__" in value else value


def plot_json(value: dict[str, Any]) -> dict[str, Any]:
    assert value["type"] == "plotly"
    return json.loads(value["plot"])


def bundled(kind: str) -> str:
    names = loading.bundled_traces()
    faulty = [n for n in names if n.startswith("default-") and n.count("-") > 1]
    correct = [n for n in names if n == "default-eqspec.json.gz"]
    chosen = faulty if kind == "faulty" else correct
    if not chosen:
        pytest.skip(f"no {kind} default-pair trace in traces/ (run tools/make_traces.py)")
    return chosen[0]


def test_load_bundled_faulty_trace(client: Any) -> None:
    out = client.call("load_bundled_a", bundled("faulty"))
    assert "DESYNC" in out["sv-summary-a"] and "Desync begins at step" in out["sv-summary-a"]
    assert out["sv-inspect"] == "A"
    grid = plot_json(out["sv-grid"])
    assert grid["data"][0]["type"] == "heatmap"
    assert "desync" in json.dumps(grid["layout"]["annotations"])  # the first violation is marked
    assert out["sv-violations"]["data"], "violations table is empty"
    table = out["sv-violations"]
    first_step = table["data"][0][table["headers"].index("step")]
    assert out["sv-step"]["value"] == first_step  # opens on the first violation's step (step == index here)
    assert plot_json(out["sv-timeline"])["data"]
    assert "data-divergent='true'" in out["sv-outputs"]


def test_load_bundled_correct_trace_and_jump(client: Any) -> None:
    out = client.call("load_bundled_b", bundled("correct"))
    assert "CLEAN" in out["sv-summary-b"] and out["sv-inspect"] == "B"
    assert "all rows as expected" in plot_json(out["sv-grid"])["layout"]["title"]["text"]
    faulty = client.call("load_bundled_a", bundled("faulty"))
    jumped = client.call("jump_first_violation", "A")
    assert jumped["sv-step"] == faulty["sv-step"]["value"]
    assert "desync" in json.dumps(plot_json(jumped["sv-grid"])["layout"]["annotations"])


def test_upload_then_malformed_upload_keeps_the_run(client: Any, tiny_trace: Path, tmp_path: Path) -> None:
    out = client.call("load_upload_b", handle_file(str(tiny_trace)))
    assert "CLEAN" in out["sv-summary-b"] and "upload tiny-eqspec.json.gz" in out["sv-summary-b"]
    steps = out["sv-step"]["maximum"]
    bad = tmp_path / "broken.json"
    bad.write_text('{"format": "specviz-trace", "header": 3}')
    # A failure is a one-line status in the slot, not an exception (which badges every output).
    status = shown(client.call("load_upload_b", handle_file(str(bad)))["sv-status-b"])
    assert "broken.json" in status and "Traceback" not in status and "\n" not in status
    garbage = tmp_path / "garbage.json.gz"
    garbage.write_bytes(b"\x1f\x8bnot gzip at all")
    assert "gzip" in shown(client.call("load_upload_b", handle_file(str(garbage)))["sv-status-b"])
    # Slot B still holds the good upload, and the app answers.
    again = client.call("inspect", "B")
    assert again["sv-step"]["maximum"] == steps


def test_bundled_name_must_be_from_the_list(client: Any) -> None:
    with pytest.raises(AppError, match="not in the list of choices|not a bundled trace"):
        client.call("load_bundled_a", "../pyproject.toml")


LIVE = {
    "method": "eqspec",
    "fault": "none",
    "batch_size": 4,
    "draft_k": 3,
    "max_new_tokens": 8,
    "num_prompts": 4,
    "prompts": "hello world\na\nthe quick brown fox\nxyz",
    "target": "tiny",
    "draft": "tiny",
}


def test_live_run_correct_and_faulty(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pair = make_pair("llama")
    monkeypatch.setattr(live, "load_model_pair", lambda target, draft, with_draft: pair)
    out = client.call("live_run_a", *LIVE.values())
    assert "CLEAN" in out["sv-summary-a"] and "live run" in out["sv-summary-a"]
    download = Path(shown(out["sv-download-a"]))  # shown once a live run has a trace
    assert download.name.startswith("live-eqspec") and download.stat().st_size > 0
    faulty = client.call("live_run_a", *{**LIVE, "fault": "stale-kv"}.values())
    assert "DESYNC" in faulty["sv-summary-a"]
    assert plot_json(faulty["sv-timeline"])["data"]


def test_live_run_bad_input_is_a_clear_error(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    out = client.call("live_run_a", *{**LIVE, "target": "/nonexistent/model"}.values())
    assert "no such model directory" in shown(out["sv-status-a"])
    try:  # Gradio's own bound check (an exception) or ours (a status line)
        status = shown(client.call("live_run_a", *{**LIVE, "batch_size": 1000}.values())["sv-status-a"])
    except AppError as error:
        status = str(error)
    assert re.search("greater than maximum|batch size must be between", status)
    # Gradio refused those inputs before the handler ran (which releases the visitor's live-run
    # mark): the gate sees the run left the queue, so this visitor is not locked out for 30 minutes.
    pair = make_pair("llama")
    monkeypatch.setattr(live, "load_model_pair", lambda target, draft, with_draft: pair)
    assert "CLEAN" in client.call("live_run_a", *LIVE.values())["sv-summary-a"]


def head_pair() -> Any:
    """The tiny llama pair with a freshly initialised head (the app loads the embedded one otherwise)."""
    from specviz.engine.proposers import EagleHead

    pair = make_pair("llama")
    pair.head = EagleHead.for_target(pair.target, inner=32, seed=1)
    return pair


def test_live_tree_run_with_a_head_opens_in_the_tree_view(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proposer and tree pickers are the endpoint's last two arguments (after the grid window
    and the outputs filter), so earlier API clients' positions hold."""
    pair, loads = head_pair(), []
    monkeypatch.setattr(live, "load_model_pair", lambda target, draft, with_draft: loads.append(with_draft) or pair)
    client = AppClient(client.demo, client.client.src)  # a session of its own: no other test's live run in its way
    out = client.call("live_run_a", *LIVE.values(), 40, False, "head", 2, "static")
    assert loads == [False]  # a head drafts: no draft model is loaded
    assert "CLEAN" in out["sv-summary-a"]  # outputs equal the batch-1 greedy reference the run decoded
    tree = out["sv-tree"]
    assert tree["visible"] and plot_json(tree["value"])["data"], "a tree run opens with its candidate trees"
    assert "acceptance per depth" in out["sv-acceptance-text"]
    saved = load_trace(shown(out["sv-download-a"]))
    assert (saved.header.proposer, saved.header.tree_branches) == ("head", 2)
    assert all(len(row.tree_parents) == 1 + 3 + 2 for step in saved.steps for row in step.rows)
    faulty = client.call("live_run_a", *{**LIVE, "fault": "tree-sibling-mask"}.values(), 40, False, "ngram", 2)
    assert "DESYNC" in faulty["sv-summary-a"]  # the same picker runs a tree fault, caught
    topk = client.call("live_run_a", *LIVE.values(), 40, False, "draft-model", 2, "topk")
    assert "CLEAN" in topk["sv-summary-a"] and topk["sv-tree"]["visible"]
    assert load_trace(shown(topk["sv-download-a"])).header.options["tree_kind"] == "topk"
    chain = client.call("live_run_a", *LIVE.values())  # an older client: no proposer, no tree
    assert "CLEAN" in chain["sv-summary-a"] and not chain["sv-tree"]["visible"]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"tree_branches": 4, "draft_k": 3}, "tree branches must be at most draft tokens k (3), got 4"),
        ({"tree_branches": 4, "draft_k": 6}, "verifies 11 tokens a row; a live run verifies at most 9"),
        ({"tree_branches": 5, "draft_k": 8}, "tree branches must be between 0 and 4, got 5"),
        ({"tree_branches": 1, "method": "baseline"}, "the baseline drafts nothing"),
        ({"proposer": "medusa\n" * 30}, "unknown proposer"),
        ({"proposer": "ngram", "fault": "shared-carry"}, "corrupts head drafting"),
        ({"tree_kind": "bushy"}, "unknown tree kind 'bushy'"),
        ({"proposer": "ngram", "tree_branches": 2, "tree_kind": "topk"}, "ngram has none"),
    ],
)
def test_live_drafting_input_is_refused_in_one_line(
    change: dict[str, Any], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "load_model_pair", lambda *a: pytest.fail("a refused run loads no model"))
    fields = {key: value for key, value in LIVE.items() if key != "prompts"}
    bundled = {"target": "", "draft": ""}  # public mode runs the bundled pair only
    request = live.LiveRequest(**{**fields, **bundled}, prompts_text=LIVE["prompts"])
    for key, value in change.items():
        setattr(request, key, value)
    with pytest.raises(SpecvizError) as error:
        live.live_run(request, lambda *a, **k: None, public=True)
    assert says in str(error.value) and "\n" not in str(error.value)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module", autouse=True)
def app_py() -> Any:
    """`python app.py` on a port of its own, started with the module: it boots (imports, a few
    seconds) on the other core while the in-process tests run, and is stopped by its test once it
    has answered (here too, should that test not run)."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT")}
    env["GRADIO_ANALYTICS_ENABLED"] = "False"
    proc = subprocess.Popen(
        [sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port)],  # `python app.py --help` shows both
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=20)


def test_python_app_py_serves_on_the_configured_port(app_py: Any) -> None:
    proc, port = app_py
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as response:
                    assert response.status == 200 and b"specviz" in response.read()
                    return
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"app.py exited: {proc.stderr.read().decode()[-2000:]}")
                time.sleep(0.5)
        pytest.fail("app.py did not answer within 90 s")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_fault_one_liner_links_a_served_faults_doc(client: Any) -> None:
    from specviz.views.faults import FAULTS_DOC_URL

    with urllib.request.urlopen(client.client.src.rstrip("/") + FAULTS_DOC_URL, timeout=10) as response:
        assert response.status == 200 and b"# Faults" in response.read()


def test_live_run_progress_counts_prompts_then_tokens_on_one_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    pair = make_pair("llama")
    monkeypatch.setattr(live, "load_model_pair", lambda target, draft, with_draft: pair)
    calls: list[tuple[Any, str | None, str]] = []
    fields = {key: value for key, value in LIVE.items() if key != "prompts"}
    request = live.LiveRequest(**{**fields, "max_new_tokens": 24}, prompts_text=LIVE["prompts"])
    live.live_run(request, lambda value, desc=None, unit="steps": calls.append((value, desc, unit)))
    units = {desc: unit for _, desc, unit in calls if desc and "loading" not in desc}
    assert units == {"reference (greedy, batch 1)": "prompts", "eqspec decoding": "tokens"}
    done, total = calls[-1][0]
    assert done == total  # sequences that stop early still end the bar at 100%
    demo = app.build_app()
    live_fn = next(f for f in demo.fns.values() if f.api_name == "live_run_a")
    assert [c.elem_id for c in live_fn.show_progress_on] == ["sv-summary-a"]  # one progress bar per run


def test_detail_outputs_keep_their_api_order(client: Any) -> None:
    """API clients read the detail values by position: the tabs' order, each tab's own order.

    (The jump button, sv-first, is an output too, but a button has no API value.)
    """
    assert client.output_ids("inspect") == [
        "sv-step", "sv-row", "sv-grid", "sv-step-text", "sv-row-text",  # ragged grid
        "sv-timeline", "sv-violations",  # invariants
        "sv-acceptance-text", "sv-acceptance", "sv-acceptance-map", "sv-sequences",  # acceptance
        "sv-kv", "sv-drift",  # KV & positions
        "sv-page", "sv-outputs",  # outputs
        "sv-grid-legend",  # added later: appended, so the positions above never move
        "sv-tree",  # tree verification's candidate trees (schema 3), appended likewise
    ]  # fmt: skip


def test_nothing_in_specviz_imports_the_app() -> None:
    """The app is thin wiring on top: only the root app.py imports specviz.app."""
    import ast

    for path in (ROOT / "specviz").rglob("*.py"):
        if (ROOT / "specviz" / "app") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            assert not any(n == "specviz.app" or n.startswith("specviz.app.") for n in names), path
