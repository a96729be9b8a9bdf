"""What `specviz watch -- python script.py` does for vLLM: ask for records, then read them.

`begin` names a fresh folder in `SPECVIZ_VLLM_RECORD` where vLLM is installed (found, not
imported: importing vLLM takes seconds), so vLLM's general plugin (`plugin`) wraps the model runner
in every vLLM process the script starts. `finish` turns the records into the trace; a script that
ran no vLLM engine left none, and the Hugging Face watch writes the trace as before.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from specviz.trace.schema import Trace
from specviz.watch.vllm import ENV


def begin() -> Path | None:
    """The records folder, announced to vLLM's processes; None where vLLM is not installed."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:  # absent, or only a folder named vllm (a namespace)
        return None
    folder = Path(tempfile.mkdtemp(prefix="specviz-vllm-"))
    os.environ[ENV] = str(folder)
    return folder


def finish(folder: Path | None, out: Path, name: str, reference: bool, complete: bool) -> bool:
    """Write the vLLM trace to `out` if a vLLM engine ran; False (nothing written) if none did."""
    if folder is None:
        return False
    os.environ.pop(ENV, None)
    from specviz.trace.io import save_trace
    from specviz.watch.vllm.trace import build_trace, take_records

    records = take_records(folder)
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
