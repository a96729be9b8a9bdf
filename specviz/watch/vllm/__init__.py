"""Watch vLLM from its own model-runner metadata (docs/vllm.md).

Per model-runner step, what vLLM declared (batch order, positions, slot mapping, block table,
drafts, the target's choices, the sampled tokens) is recorded and turned into a specviz trace, by
`specviz watch --out T -- python their_vllm_script.py` or by:

    from specviz.watch.vllm import VllmWatch
    with VllmWatch("t.json.gz") as watch:
        llm = LLM(...)                       # built inside: an engine process inherits the request
        outputs = llm.generate(prompts, params)
    watch.trace                               # the Trace, also written to t.json.gz

vLLM is imported only inside vLLM's own processes (`capture`); this package imports without it.
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
