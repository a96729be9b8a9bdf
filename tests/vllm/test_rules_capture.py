"""The capture's tap (specviz/watch/vllm/capture.py) without vLLM: a stand-in runner class is wrapped
as `install` wraps vLLM's."""

from types import SimpleNamespace

from specviz.watch.vllm import capture


def test_an_engine_core_that_outlives_its_watch_unwraps_and_runs_on(tmp_path, monkeypatch) -> None:
    """An engine core in its own process keeps the tap its plugin installed after `VllmWatch` closed and
    removed the records folder: its next step puts vLLM's methods back and runs (it raised
    FileNotFoundError writing that step's record, which failed the next `generate`)."""

    class Runner:
        def execute_model(self, scheduler_output):
            return f"ran {scheduler_output.total_num_scheduled_tokens} tokens"

    original = Runner.__dict__["execute_model"]
    monkeypatch.setattr(capture, "_TAP", capture.StepTap(tmp_path / "removed" / "engine-1.jsonl"))
    capture._wrap(Runner, "execute_model")
    assert Runner.__dict__["execute_model"] is not original
    assert Runner().execute_model(SimpleNamespace(total_num_scheduled_tokens=4)) == "ran 4 tokens"
    assert Runner.__dict__["execute_model"] is original and capture._TAP.path is None and not capture._ORIGINALS
