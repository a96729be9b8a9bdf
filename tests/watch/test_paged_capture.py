"""`watch.paged.PagedCapture`: transformers' continuous-batching manager read as declared rows and
emits, on hand-built request states (the fields the manager keeps: request_id, initial_tokens,
generated_tokens, status, _eos_token_ids) and a sink that records what it is told. The manager
itself, under a watch, is `test_zoo_production.py` (`paged*`)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from specviz.watch.paged import PagedCapture


class Sink:
    def __init__(self) -> None:
        self.said: list[tuple] = []

    def declare_forward(self, seq_ids: tuple[int, ...]) -> None:
        self.said.append(("forward", seq_ids))

    def report(self, seq_id: int, token_ids: list[int], finish_reason: str | None = None) -> None:
        """The manager's channel (`Watch.report`): what each request gained, read, not declared."""
        self.said.append(("emit", seq_id, token_ids, finish_reason))


def request(rid: str, prompt: list[int], eos=(1,)) -> SimpleNamespace:
    return SimpleNamespace(
        request_id=rid, initial_tokens=prompt, generated_tokens=[], status=SimpleNamespace(name="DECODING"),
        _eos_token_ids=set(eos),
    )  # fmt: skip


def test_requests_become_the_declared_prompts_they_equal() -> None:
    """Declared prompts [a, b, a]: the requests for a take 0 then 2 (the first equal prompt not yet
    taken), b takes 1, in any order of arrival; an undeclared prompt after them the next id (3)."""
    a, b, c = [5, 6], [7], [9, 9]
    sink = Sink()
    capture = PagedCapture(sink, [a, b, a])
    capture.forward([request("r1", b), request("r2", a)])
    capture.forward([request("r4", a), request("r3", c), request("r2", a)])
    assert sink.said == [("forward", (1, 0)), ("forward", (2, 3, 0))]
    assert capture.seq_of == {"r1": 1, "r2": 0, "r3": 3, "r4": 2}
    one = PagedCapture(Sink(), [a])  # more requests than declared prompts: numbered after them
    one.forward([request("s1", a), request("s2", c), request("s3", b)])
    assert one.seq_of == {"s1": 0, "s2": 1, "s3": 2}


def test_an_undeclared_prompt_never_takes_a_declared_prompts_sequence() -> None:
    a, b, c = [5, 6], [7], [9, 9]
    sink = Sink()
    capture = PagedCapture(sink, [a, b, a])
    capture.forward([request("r1", b), request("r2", a)])
    capture.forward([request("r3", c), request("r4", a)])
    assert capture.seq_of["r4"] == 2 and capture.seq_of["r3"] == 3


def test_without_declared_prompts_requests_are_numbered_as_they_arrive() -> None:
    sink = Sink()
    capture = PagedCapture(sink, None)
    capture.forward([request("x", [4, 5]), request("y", [6])])
    capture.forward([request("y", [6]), request("z", [4, 5])])
    assert sink.said == [("forward", (0, 1)), ("forward", (1, 2))]
    assert capture.prompts == [[4, 5], [6], [4, 5]]


def test_each_update_emits_what_each_request_gained_and_how_it_ended() -> None:
    """A prefill chunk gains nothing (no emit); tokens are emitted once each; a finished request
    ends with "eos" when its last token is one of its EOS ids, else "length"."""
    sink = Sink()
    capture = PagedCapture(sink, [[5], [6], [7]])
    r0, r1, r2 = request("a", [5]), request("b", [6], eos=(24, 25)), request("c", [7])
    capture.forward([r0, r1, r2])
    r0.generated_tokens = [30]
    capture.updated()  # r1, r2: prefill chunks
    assert sink.said[1:] == [("emit", 0, [30], None)] and capture.batch == []
    capture.forward([r0, r1, r2])
    r0.generated_tokens, r0.status.name = [30, 31], "FINISHED"
    r1.generated_tokens, r1.status.name = [40, 41, 25], "FINISHED"
    r2.generated_tokens = [50, 51]
    capture.updated()
    assert sink.said[3:] == [
        ("emit", 0, [31], "length"),
        ("emit", 1, [40, 41, 25], "eos"),
        ("emit", 2, [50, 51], None),
    ]
    assert capture.eos_ids == {1, 24, 25}
    capture.updated()  # nothing in flight: nothing said
    assert len(sink.said) == 6


def test_install_wraps_the_manager_and_uninstall_restores_it() -> None:
    from transformers.generation.continuous_batching import continuous_api, input_outputs

    io_class, processor = input_outputs.ContinuousBatchingIOs, continuous_api.ContinuousBatchProcessor
    before = (io_class.prepare_batch_tensors, processor.update_batch)
    capture = PagedCapture(Sink(), None)
    assert capture.install()
    try:
        assert (io_class.prepare_batch_tensors, processor.update_batch) != before
        assert io_class.prepare_batch_tensors is not before[0] and processor.update_batch is not before[1]
    finally:
        capture.uninstall()
    assert (io_class.prepare_batch_tensors, processor.update_batch) == before
    capture.uninstall()  # twice: nothing left to restore
    assert (io_class.prepare_batch_tensors, processor.update_batch) == before


def test_an_update_with_no_forward_in_flight_says_nothing() -> None:
    sink = Sink()
    PagedCapture(sink, None).updated()
    assert sink.said == []


def test_the_wrapped_manager_returns_what_it_returned_and_tells_the_capture(monkeypatch) -> None:
    """The wrappers around the manager's two methods (stand-ins here, so no model runs): each
    returns the original's result unchanged; the forward's requests are declared after it
    prepared them, their tokens emitted after the update."""
    from transformers.generation.continuous_batching import continuous_api, input_outputs

    io_class, processor = input_outputs.ContinuousBatchingIOs, continuous_api.ContinuousBatchProcessor
    state = request("q", [5, 6])
    monkeypatch.setattr(io_class, "prepare_batch_tensors", lambda io, requests, *a, **k: ("prepared", len(requests)))
    monkeypatch.setattr(processor, "update_batch", lambda proc, *a, **k: "updated")
    sink = Sink()
    capture = PagedCapture(sink, [[5, 6]])
    assert capture.install()
    try:
        assert io_class.prepare_batch_tensors(None, [SimpleNamespace(state=state)], 7) == ("prepared", 1)
        assert sink.said == [("forward", (0,))]
        state.generated_tokens = [30]
        assert processor.update_batch(None) == "updated"
        assert sink.said[1:] == [("emit", 0, [30], None)]
    finally:
        capture.uninstall()


def test_without_continuous_batching_nothing_is_installed(monkeypatch) -> None:
    """A transformers without `generation.continuous_batching`: install says so (False), wraps nothing."""
    from transformers.generation.continuous_batching import continuous_api, input_outputs

    io_class, processor = input_outputs.ContinuousBatchingIOs, continuous_api.ContinuousBatchProcessor

    def methods() -> tuple:
        return io_class.prepare_batch_tensors, processor.update_batch

    before = methods()
    monkeypatch.setitem(sys.modules, "transformers.generation.continuous_batching", None)
    capture = PagedCapture(Sink(), None)
    assert capture.install() is False
    capture.uninstall()
    assert methods() == before
