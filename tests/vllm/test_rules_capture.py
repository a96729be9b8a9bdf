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


def test_a_watch_where_vllm_does_not_import_says_so_and_leaves_nothing_behind(monkeypatch) -> None:
    """`VllmWatch` where vLLM does not import: one line with the usual fix (docs/vllm.md, trap 1), and the
    records variable and folder it set up are undone (they stayed: later vLLM processes recorded there)."""
    import os

    import pytest

    from specviz.errors import SpecvizError
    from specviz.watch.vllm import ENV, VllmWatch, session

    def no_vllm(folder):
        raise ImportError("operator torchvision::nms does not exist")

    made = []

    def begin():
        made.append(real_begin())
        return made[-1]

    real_begin = session.begin
    monkeypatch.setattr(capture, "install", no_vllm)
    monkeypatch.setattr(session, "begin", begin)
    monkeypatch.setenv(ENV, "/an/outer/watch")
    with pytest.raises(SpecvizError, match=r"vLLM does not import here: .*pip uninstall -y torchvision"):
        with VllmWatch():
            pass
    assert os.environ[ENV] == "/an/outer/watch" and len(made) == 1 and not made[0].exists()
