"""The two ways a vLLM run is recorded (docs/vllm.md): `VllmWatch` around the code that builds the
engines (entering also wraps the runner in this process, for an in-process engine core), and
`begin` / `finish` around the script `specviz watch -- python script.py` runs.

Both set `SPECVIZ_VLLM_RECORD` to a fresh folder before vLLM starts, so vLLM's general plugin
(`plugin`) wraps the model runner in every vLLM process; an engine core in its own process writes
each step's record as the step ends, so nothing waits for that process to exit. At the end vLLM is
unwrapped in this process, `SPECVIZ_VLLM_RECORD` put back, and the records become the trace.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from specviz.trace.schema import Trace
from specviz.watch.vllm import ENV, capture
from specviz.watch.vllm.trace import build_trace, read_records


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

        if self._saved_env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self._saved_env
        self.trace = build_trace(_take_records(self._folder), self.name, reference=self.reference, complete=complete)
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


def begin() -> Path | None:
    """The command's records folder; None where vLLM is not installed (found, not imported:
    importing vLLM takes seconds)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:  # absent, or only a folder named vllm (a namespace)
        return None
    folder = Path(tempfile.mkdtemp(prefix="specviz-vllm-"))
    os.environ[ENV] = str(folder)
    return folder


def finish(folder: Path | None, out: Path, name: str, reference: bool, complete: bool) -> bool:
    """Write the vLLM trace to `out` if a vLLM engine ran; False (nothing written, the Hugging Face
    watch writes the trace) if none did."""
    if folder is None:
        return False
    os.environ.pop(ENV, None)
    from specviz.trace.io import save_trace

    records = _take_records(folder)
    if not records:
        return False
    trace = build_trace(records, name, reference=reference, complete=complete)
    save_trace(trace, out)
    h = trace.header
    what = h.proposer if h.draft_k else "no speculation"
    engine = f"vLLM {h.library_versions.get('vllm', '?')}, target {Path(h.target.name).name}, {what}"
    announce(trace, out, engine, "requests")
    return True


def announce(trace: Trace, out: Path, engine: str, sequences: str) -> None:
    """The one line `specviz watch` ends with: what was traced, and where."""
    h = trace.header
    print(
        f"specviz watch: {engine}, k={h.draft_k}, {len(trace.sequences)} {sequences}, "
        f"{len(trace.steps)} steps{'' if h.complete else ' (incomplete)'}; trace {out} "
        f"(next: python -m specviz check {out})",
        file=sys.stderr,
    )


def _take_records(folder: Path) -> list[dict[str, Any]]:
    """Unwrap vLLM in this process (an in-process engine core), then the records under `folder`,
    which is removed."""
    capture.uninstall()
    try:
        return read_records(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
