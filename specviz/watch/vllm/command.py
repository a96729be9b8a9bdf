"""What `specviz watch -- python script.py` does for vLLM: ask for records, then read them.

`begin` names a fresh folder in `SPECVIZ_VLLM_RECORD` where vLLM is installed (found, not
imported: importing vLLM takes seconds); vLLM's general plugin (this package's entry point) then
wraps the model runner in every vLLM process the script starts, the engine core in-process or in
its own. `finish` turns what was recorded into the trace; a script that never ran a vLLM engine
left no records, and the Hugging Face watch writes the trace as before.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

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
    try:
        from specviz.watch.vllm.trace import build_trace, read_records

        records = read_records(folder)
        if not records:
            return False
        if "vllm.v1.worker.gpu_model_runner" in sys.modules:  # an in-process engine: unwrap it
            from specviz.watch.vllm import capture

            capture.uninstall()
        trace = build_trace(records, name, reference=reference, complete=complete)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    from specviz.trace.io import save_trace

    save_trace(trace, out)
    h = trace.header
    print(
        f"specviz watch: vLLM {h.library_versions.get('vllm', '?')}, target {Path(h.target.name).name}, "
        f"{h.proposer if h.draft_k else 'no speculation'}, k={h.draft_k}, {len(trace.sequences)} requests, "
        f"{len(trace.steps)} steps{'' if h.complete else ' (incomplete)'}; trace {out} "
        f"(next: python -m specviz check {out})",
        file=sys.stderr,
    )
    return True
