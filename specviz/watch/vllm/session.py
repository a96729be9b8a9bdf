"""`VllmWatch`: record the vLLM engines built inside it, then write their trace.

Entering sets `SPECVIZ_VLLM_RECORD` to a fresh folder (the plugin in an engine-core process reads
it) and wraps the runner in this process (an in-process engine core); leaving puts both back and
writes the trace. An engine core in its own process writes each step's record as the step ends,
so nothing waits for that process to exit.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import TracebackType

from specviz.trace.schema import Trace
from specviz.watch.vllm import ENV


class VllmWatch:
    def __init__(self, out: str | os.PathLike[str] | None = None, name: str = "vllm", reference: bool = True) -> None:
        self.out = Path(out) if out is not None else None
        self.name = name
        self.reference = reference
        self.trace: Trace | None = None
        self._folder: Path | None = None
        self._saved_env: str | None = None

    def __enter__(self) -> VllmWatch:
        self._folder = Path(tempfile.mkdtemp(prefix="specviz-vllm-"))
        self._saved_env = os.environ.get(ENV)
        os.environ[ENV] = str(self._folder)
        try:
            from specviz.watch.vllm import capture

            capture.install(self._folder)
        except ImportError as e:  # no vLLM here: nothing to wrap in this process
            raise_without_vllm(e)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(complete=exc_type is None)

    def close(self, complete: bool = True) -> Trace:
        """Unwrap vLLM, build the trace from the records, write it to `out`; returns it."""
        from specviz.trace.io import save_trace
        from specviz.watch.vllm.trace import build_trace, take_records

        if self._saved_env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self._saved_env
        self.trace = build_trace(take_records(self._folder), self.name, reference=self.reference, complete=complete)
        if self.out is not None:
            save_trace(self.trace, self.out)
        return self.trace


def raise_without_vllm(error: ImportError) -> None:
    """One line, with the usual fix, where vLLM does not import."""
    from specviz.errors import SpecvizError

    hint = ""
    if "torchvision" in str(error) or "nms" in str(error):
        hint = " (pip uninstall -y torchvision torchaudio torchcodec: PyPI's builds do not match torch+cpu)"
    raise SpecvizError(f"watch: vLLM does not import here: {error}{hint}") from error
