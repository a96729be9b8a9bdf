"""specviz: correctness forensics for batch speculative decoding.

The Python API (docs/forensics.md, docs/watch.md):

    import specviz
    report = specviz.check_trace(specviz.load_trace("runs/eq.json.gz"))   # no model needed
    with specviz.watch(target, draft, tokenizer=tok, prompts=prompts, out="mine.json.gz") as w:
        ...                                                                # your engine, watched

`import specviz` stays light: nothing here imports torch (or pandas) until a name is used.
"""

from __future__ import annotations

__version__ = "0.2.0"

# First, before the imports below pull in torch: Ctrl-C while `specviz` starts exits quietly.
from specviz.startup import lazy_arrow_arenas, quiet_interrupt_while_starting  # noqa: E402

quiet_interrupt_while_starting()
lazy_arrow_arenas()  # before pyarrow is imported: its allocator reads the setting once

import os  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

# Python binds `specviz.watch` to the subpackage `specviz/watch/` when the subpackage is first
# imported. Import it now (its __init__ is light), so that the function below, defined after it,
# is what `specviz.watch` names for good: later imports of `specviz.watch.session` and friends
# find the subpackage in sys.modules and bind nothing here. `from specviz.watch import Watch`
# still reads the subpackage.
import specviz.watch as _watch_package  # noqa: E402, F401

if TYPE_CHECKING:
    from specviz.analysis.check import check_trace
    from specviz.analysis.report import Report
    from specviz.trace.invariants import Invariant
    from specviz.trace.io import load_trace
    from specviz.watch.session import Watch

__all__ = ["Invariant", "Report", "__version__", "check_trace", "load_trace", "watch"]

_LAZY = {
    "check_trace": "specviz.analysis.check",
    "Report": "specviz.analysis.report",
    "Invariant": "specviz.trace.invariants",
    "load_trace": "specviz.trace.io",
}


def watch(
    target: Any,
    draft: Any | None = None,
    *,
    tokenizer: Any | None = None,
    prompts: list[list[int]] | list[str] | None = None,
    out: str | os.PathLike[str] | None = None,
    name: str | None = None,
    layout: str = "unspecified",
    temperature: float = 0.0,
    logits_processed: bool = False,
    drafter: Any | None = None,
) -> Watch:
    """Watch `target` (and `draft`) decode: forward hooks that trace any engine on HF models.

    `prompts`: token-id lists or strings (with `tokenizer`), in seq_id order. `layout`:
    "left-padded" if the engine keeps the left-padded contiguous layout and wants it checked.
    `temperature`: > 0 when the engine samples (speculative rejection sampling): accounting,
    positions and KV are checked, equality with a greedy oracle is not asked. `logits_processed`:
    True when the engine's greedy choice is made on processed logits (HF `min_new_tokens`,
    `repetition_penalty`, ...); checked the same way. `drafter`: a draft head (a module fed the
    target's hidden states: EAGLE, MTP, Medusa) whose calls are captured as draft calls.
    Use it as a context manager and declare each sequence's tokens with `w.emit(seq_id, tokens)`;
    see docs/watch.md. The same function as `specviz.watch.session.watch`.
    """
    from specviz.watch.session import watch as watch_models

    return watch_models(
        target,
        draft,
        tokenizer=tokenizer,
        prompts=prompts,
        out=out,
        name=name,
        layout=layout,
        temperature=temperature,
        logits_processed=logits_processed,
        drafter=drafter,
    )


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specviz' has no attribute {name!r}")
