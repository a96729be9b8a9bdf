"""Watch vLLM from its own model-runner metadata (docs/vllm.md): per runner step, what vLLM declared
becomes a specviz trace, by `specviz watch --out T -- python their_vllm_script.py` or by `VllmWatch`
around the code that builds and runs the engines. vLLM is imported only inside vLLM's own processes
(`capture`), torch only once a watch starts: this package imports without either."""

from __future__ import annotations

import os

from specviz.trace.schema import Trace

ENV = "SPECVIZ_VLLM_RECORD"  # the folder a vLLM process writes its step records to; unset: inert

__all__ = ["ENV", "VllmWatch"]


class VllmWatch:
    """`with VllmWatch("t.json.gz") as watch:` around building and running the `LLM`: `watch.trace`."""

    def __init__(self, out: str | os.PathLike[str] | None = None, name: str = "vllm", reference: bool = True) -> None:
        self.out, self.name, self.reference = out, name, reference
        self.trace: Trace | None = None

    def __enter__(self) -> VllmWatch:
        from specviz.errors import SpecvizError
        from specviz.watch.vllm import capture, session

        self._saved_env, self._folder = os.environ.get(ENV), session.begin()
        try:
            capture.install(self._folder)  # this process's runner too: an in-process engine core
        except ImportError as e:  # no vLLM here: one line, with the usual fix (docs/vllm.md, trap 1)
            session.take_records(self._folder, self._saved_env)  # no watch: the variable back, the folder gone
            hint = ""
            if "torchvision" in str(e):  # its error names torchvision::nms
                hint = " (pip uninstall -y torchvision torchaudio torchcodec: PyPI's builds do not match torch+cpu)"
            raise SpecvizError(f"watch: vLLM does not import here: {e}{hint}") from e
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(complete=exc_type is None)

    def close(self, complete: bool = True) -> Trace:
        """Unwrap vLLM, build the trace from the records, write it to `out`; returns it."""
        from specviz.trace.io import save_trace
        from specviz.watch.vllm.session import take_records
        from specviz.watch.vllm.trace import build_trace

        records = take_records(self._folder, self._saved_env)
        self.trace = build_trace(records, self.name, reference=self.reference, complete=complete)
        if self.out is not None:
            save_trace(self.trace, self.out)
        return self.trace
