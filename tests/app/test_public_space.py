"""Issue 23: the public Space against a hostile visitor, round two. The piece table and every string
inside the budget, the outputs view reading the table once, fair lanes, the memory ceiling, cleanup
on SIGTERM and at start-up, file errors without paths, uploads owned by their session. The
whole-app measurements are `tools/attack_suite.py --quick`; these are the parts testable in-process.
"""

from __future__ import annotations

import json

import pytest

from specviz.trace.budget import DEFAULT_BUDGET, PUBLIC_BUDGET, over_budget
from specviz.trace.io import TraceError, parse_trace_bytes, trace_to_dict
from specviz.trace.synthetic import synthetic_trace
from specviz.trace.token_text import trace_token_ids


def small() -> dict:
    return trace_to_dict(synthetic_trace(4, 2, 2, 6))


def with_pieces(data: dict, ids: list[int]) -> dict:
    data["header"]["token_text"] = {str(i): f"t{i}" for i in ids}
    return data


# ----------------------------------------------------------------------------- the budget


def test_a_piece_table_of_the_ids_in_use_is_accepted() -> None:
    trace = synthetic_trace(4, 2, 2, 6)
    data = with_pieces(trace_to_dict(trace), sorted(trace_token_ids(trace)))
    assert over_budget(data) is None
    assert over_budget(data, PUBLIC_BUDGET) is None


def test_the_piece_table_is_bounded_by_use_vocabulary_and_size() -> None:
    data = small()
    used = max(trace_token_ids(synthetic_trace(4, 2, 2, 6)))
    unused = with_pieces(small(), [used + 1])
    assert "not used anywhere" in over_budget(unused)
    vocab = data["header"]["target"]["vocab_size"]
    beyond = with_pieces(small(), [vocab + 5])
    assert "vocabulary" in over_budget(beyond)
    many = with_pieces(small(), list(range(300_000)))
    assert "piece table entries" in over_budget(many)
    long_text = small()
    long_text["header"]["token_text"] = {"1": "x" * (5 << 20)}
    assert "characters in the piece table" in over_budget(long_text, PUBLIC_BUDGET)
    legacy = small()
    legacy["header"]["options"]["token_text"] = {str(i): "x" for i in range(300_000)}
    assert "piece table entries" in over_budget(legacy)


def test_every_string_and_header_value_counts() -> None:
    prompts = small()
    prompts["sequences"][0]["prompt"] = "x" * (5 << 20)
    assert "characters of text" in over_budget(prompts, PUBLIC_BUDGET)
    options = small()
    options["header"]["options"]["junk"] = [[0]] * 30_000
    assert "values in the header" in over_budget(options, PUBLIC_BUDGET)
    events = small()
    events["header"]["fault_events"] = [{"a": "b"}] * 60_000
    assert "values in the header" in over_budget(events)


def test_uploads_get_the_public_budget_in_public_mode(tmp_path, monkeypatch) -> None:
    from specviz.app import loading, uploads

    data = small()
    # One step over the public budget's count (12,001, was 20,001), far under the default budget's.
    data["steps"] = data["steps"][:1] * (PUBLIC_BUDGET.max_steps + 1)
    for i, step in enumerate(data["steps"]):
        data["steps"][i] = {**step, "step": i}
    assert PUBLIC_BUDGET.max_steps < DEFAULT_BUDGET.max_steps  # so only the public budget refuses it
    text = json.dumps(data)
    path = tmp_path / "steps.json"
    path.write_text(text)
    monkeypatch.setenv("SPACE_ID", "x/y")
    uploads.UPLOADS.uploaded([path])  # as the app's /upload and the event that queued it record
    uploads.UPLOADS.claim("visitor", [path])
    with pytest.raises(TraceError, match="step count"):
        loading.load_upload(str(path), "visitor")
    with pytest.raises(TraceError, match="step count"):  # the same file through the bytes reader
        parse_trace_bytes(text.encode(), "x.json", budget=PUBLIC_BUDGET)


def test_outputs_read_the_piece_table_once_per_loaded_run(monkeypatch) -> None:
    from specviz.views import analyse, outputs, slot_outputs_html

    trace = synthetic_trace(16, 4, 2, 6)
    trace.header.token_text = {str(i): f"t{i}" for i in sorted(trace_token_ids(trace))}
    loaded, other = analyse(trace, "a"), analyse(trace, "b")
    calls = []
    monkeypatch.setattr(outputs, "token_texts", lambda t: calls.append(t) or {})
    html = slot_outputs_html(loaded, other, "A", 1, False)
    assert calls == [] and "t" in html  # the loaded runs' tables, never rebuilt per card or column


# ----------------------------------------------------------------------------- fair lanes


class _Event:
    def __init__(self, session: str, fn: object) -> None:
        self.session_hash, self.fn = session, fn


def test_fair_lanes_serve_the_least_served_visitor_and_one_job_per_kind() -> None:
    from specviz.app.lanes import FairLanes
    from specviz.app.serve import LIVE_CONCURRENCY_ID

    inspect, grid = object(), object()
    lanes = FairLanes(per_session=2)
    flood = [_Event("attacker", inspect) for _ in range(3)]
    visitor = _Event("visitor", inspect)
    running = [_Event("attacker", grid)]
    # The attacker already runs a job: the visitor's, queued last, goes first.
    assert lanes.pick([*flood, visitor], running) is visitor
    # Never two of one visitor's jobs of a kind at once, never more than per_session in all.
    assert lanes.pick(flood, [_Event("attacker", inspect)]) is None
    assert lanes.pick(flood, [_Event("attacker", grid), _Event("attacker", object())]) is None
    assert lanes.pick(flood, []) is flood[0]
    # The default: one running job a visitor, a live run (its own lane of one) not counted.
    one = FairLanes()
    live = _Event("attacker", object())
    live.concurrency_id = LIVE_CONCURRENCY_ID
    assert one.pick(flood, [live]) is flood[0]
    assert one.pick([*flood, visitor], [_Event("attacker", grid)]) is visitor
    assert one.pick(flood, [_Event("attacker", grid)]) is None


def test_a_replaced_job_ends_as_a_success_that_changes_nothing() -> None:
    """A visitor's newer job of a kind replaces their queued one. The old one must not end as an
    error: the page would badge each of its outputs "Error" (seen in the browser test on a loaded
    machine) though the visitor only clicked again. It ends as a success whose every output is
    `NO_CHANGE`; another visitor's job and another kind stay queued."""
    import asyncio
    import types

    from gradio.server_messages import ProcessCompletedMessage

    import app as app_module
    from specviz.app import lanes as lanes_module

    grid_fn = next(fn for fn in app_module.build_app().fns.values() if fn.api_name == "grid")
    other_fn = object()

    def event(session: str, fn: object, name: str) -> _Event:
        e = _Event(session, fn)
        e._id, e.concurrency_id = name, "lane"  # type: ignore[attr-defined]
        return e

    older, newer = event("visitor", grid_fn, "older"), event("visitor", grid_fn, "newer")
    kept = [event("other", grid_fn, "other visitor"), event("visitor", other_fn, "other kind")]
    lane = types.SimpleNamespace(queue=[older, *kept, newer])
    sent: list[tuple[str, object]] = []
    queue = types.SimpleNamespace(
        event_ids_to_events={e._id: e for e in lane.queue},
        event_queue_per_concurrency_id={"lane": lane},
        pending_event_ids_session={"visitor": {"older", "newer", "other kind"}},
        delete_lock=asyncio.Lock(),
        send_message=lambda e, message: sent.append((e._id, message)),
    )
    lanes = lanes_module.FairLanes()
    asyncio.run(lanes_module._drop_replaced(queue, "newer", lanes))

    assert lane.queue == [*kept, newer] and lanes.replaced == 1
    assert "older" not in queue.event_ids_to_events and queue.pending_event_ids_session["visitor"] == {
        "newer",
        "other kind",
    }
    [(replaced, message)] = sent
    assert isinstance(message, ProcessCompletedMessage)
    assert replaced == "older" and message.success and "error" not in message.output
    assert message.output["data"] == [lanes_module.NO_CHANGE] * len(grid_fn.outputs) and len(grid_fn.outputs) > 0


# ----------------------------------------------------------------------------- memory ceiling


class _Run:
    shared = False


def test_memory_ceiling_unloads_least_recently_used_runs_of_idle_sessions() -> None:
    from specviz.app.memory import RunMemory, unload_run

    memory = RunMemory(ceiling=250, estimate=lambda run: 100)
    runs = [_Run() for _ in range(4)]
    for i, run in enumerate(runs):
        memory.begin(f"s{i}")
        memory.track(run, f"s{i}")
        memory.end(f"s{i}")
    # Four runs of 100 under a ceiling of 250: the two oldest sessions' runs were unloaded.
    assert [getattr(r, "evicted", False) for r in runs] == [True, True, False, False]
    assert memory.total() == 200 and memory.evicted == 2
    memory.begin("s2")  # a session in the middle of a request keeps its run
    memory.track(_Run(), "s9")
    assert not getattr(runs[2], "evicted", False) and runs[3].evicted
    shared = _Run()
    shared.shared = True
    memory.track(shared, "s10")  # bundled runs belong to everyone: never counted
    assert not getattr(shared, "evicted", False)
    husk = _Run()
    husk.trace = "big"
    unload_run(husk)
    assert husk.trace is None and husk.evicted


def test_an_unloaded_run_reaches_handlers_as_an_empty_slot_with_a_note() -> None:
    import warnings

    from specviz.app.memory import UNLOADED_MESSAGE, RunMemory, install_memory

    seen = []

    class Fn:
        def __init__(self, fn):
            self.fn = fn

    class Demo:
        fns = {0: Fn(lambda run, other: seen.append((run, other)) or {"state": _Run()})}

    memory = RunMemory(ceiling=10**9, estimate=lambda run: 1)
    assert install_memory(Demo, memory, _Run) == 1
    gone, kept = _Run(), _Run()
    gone.evicted = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = Demo.fns[0].fn(gone, kept)
    assert seen == [(None, kept)]
    assert any(UNLOADED_MESSAGE in str(w.message) for w in caught)
    assert memory.total() == 1 and result["state"] is not None  # the new run is counted


# ----------------------------------------------------------------------------- files


def test_start_up_removes_only_folders_of_dead_app_processes(tmp_path) -> None:
    import subprocess
    import sys

    from specviz.app.files import GRADIO_PREFIX, LIVE_PREFIX, OWNER_MARKER, owned_folder, sweep_dead_folders

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    crashed = tmp_path / f"{LIVE_PREFIX}old"
    crashed.mkdir()
    (crashed / OWNER_MARKER).write_text(f"{dead.stdout.strip()} 1")
    (crashed / "trace.json.gz").write_text("x")
    mine = owned_folder(GRADIO_PREFIX, tmp_path)  # this process: alive
    unmarked = tmp_path / f"{LIVE_PREFIX}someone-else"
    unmarked.mkdir()
    other = tmp_path / "gradio-other-app"
    other.mkdir()
    assert sweep_dead_folders([tmp_path]) == [crashed.name]
    assert not crashed.exists() and mine.exists() and unmarked.exists() and other.exists()


def test_file_errors_never_show_server_paths(tmp_path) -> None:
    from specviz.app import loading, uploads
    from specviz.app.serve import without_paths
    from specviz.errors import SpecvizError

    secret = tmp_path / "gradio" / "0123abcd" / "trace.json"
    uploads.UPLOADS.uploaded([secret])
    uploads.UPLOADS.claim("visitor", [secret])
    for session in ("visitor", "another visitor"):  # gone, or not this session's: one answer
        with pytest.raises(SpecvizError) as error:
            loading.load_upload(str(secret), session)
        assert str(tmp_path) not in str(error.value) and error.value.args[0] == loading.UPLOAD_GONE
    message = without_paths(f"unexpected error: FileNotFoundError: [Errno 2] No such file: '{secret}'")
    assert str(tmp_path) not in message and "trace.json" in message
