"""Recording a vLLM run (docs/vllm.md): `begin` / `finish` around the script `specviz watch` runs, as
`VllmWatch` around its code, set `SPECVIZ_VLLM_RECORD` to a fresh folder before vLLM starts, so that
vLLM's general plugin (`plugin`) has each vLLM process write its steps there; the records become the trace."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from specviz.trace.io import save_trace
from specviz.trace.schema import Trace
from specviz.watch.vllm import ENV, capture
from specviz.watch.vllm.trace import build_trace, read_records


def begin() -> Path:
    """A fresh records folder, named to vLLM's processes started from now on (inert where no vLLM runs)."""
    folder = Path(tempfile.mkdtemp(prefix="specviz-vllm-"))
    os.environ[ENV] = str(folder)
    return folder


def finish(folder: Path, out: Path, name: str, reference: bool, complete: bool) -> bool:
    """Write the vLLM trace to `out` if a vLLM engine ran; False (the Hugging Face watch writes it) if not."""
    records = take_records(folder)
    if not records:
        return False
    trace = build_trace(records, name, reference=reference, complete=complete)
    save_trace(trace, out)
    h = trace.header
    what = h.proposer if h.draft_k else "no speculation"
    announce(trace, out, f"vLLM {h.library_versions['vllm']}, target {Path(h.target.name).name}, {what}", "requests")
    return True


def announce(trace: Trace, out: Path, engine: str, sequences: str) -> None:
    """The one line `specviz watch` ends with: what was traced, and where."""
    h = trace.header
    what = f"{engine}, k={h.draft_k}, {len(trace.sequences)} {sequences}, {len(trace.steps)} steps"
    where = f"trace {out} (next: python -m specviz check {out})"
    print(f"specviz watch: {what}{'' if h.complete else ' (incomplete)'}; {where}", file=sys.stderr)


def take_records(folder: Path, saved_env: str | None = None) -> list[dict[str, Any]]:
    """Put SPECVIZ_VLLM_RECORD back to `saved_env`, unwrap vLLM in this process, read and remove `folder`."""
    if saved_env is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = saved_env
    capture.uninstall()
    try:
        return read_records(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
