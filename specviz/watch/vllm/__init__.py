"""Watch vLLM from its own model-runner metadata (docs/vllm.md).

`specviz watch --out T -- python their_vllm_script.py` and the API below record, per model-runner
step, what vLLM declared (batch order, positions, slot mapping, block table, drafts, the target's
choices, the sampled tokens) and turn it into a specviz trace. vLLM is imported only inside vLLM's
own processes (`capture`, installed by the plugin or in-process); this package imports without it.

    from specviz.watch.vllm import VllmWatch
    with VllmWatch("t.json.gz") as watch:
        llm = LLM(...)                       # built inside: an engine process inherits the request
        outputs = llm.generate(prompts, params)
    watch.trace                               # the Trace, also written to t.json.gz

Files: `capture` (the wrappers, inside vLLM), `plugin` (vLLM's entry point, inert unless asked),
`slots` (the KV slot ledger), `steps` (records -> maps and trace steps), `trace` (-> the trace),
`session` (this context manager, used by `specviz watch`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specviz.watch.vllm.session import VllmWatch

ENV = "SPECVIZ_VLLM_RECORD"  # the folder a vLLM process writes its step records to; unset: inert

__all__ = ["ENV", "VllmWatch"]


def __getattr__(name: str) -> Any:
    if name == "VllmWatch":
        from specviz.watch.vllm.session import VllmWatch

        return VllmWatch
    raise AttributeError(f"module 'specviz.watch.vllm' has no attribute {name!r}")
