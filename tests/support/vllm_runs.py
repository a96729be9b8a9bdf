"""Shared by tests/vllm: vLLM's settings for this machine, one engine per method, a watched run.

The engine core runs in the test's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), one OpenMP
thread, a 64 MiB KV reservation (the machine is shared), fp32 and eager mode. The prompts and
methods are the user script's (tests/vllm/offline_script.py), imported, not copied.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

for _name, _value in (
    ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
    ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
    ("OMP_NUM_THREADS", "1"),
):
    os.environ.setdefault(_name, _value)

SCRIPT = Path(__file__).resolve().parents[1] / "vllm" / "offline_script.py"
KV_BYTES = 64 << 20
EARLY = 3  # the prompt whose own max_tokens (7) ends it before the others (24)
BUDGETS = [7 if i == EARLY else 24 for i in range(8)]


def script_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("offline_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_llm(method: str) -> Any:
    from vllm import LLM

    script = script_module()
    return LLM(
        model=str(script.ASSETS / "default-target"),
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,
        max_num_seqs=8,
        kv_cache_memory_bytes=KV_BYTES,
        speculative_config=script.SPECULATION[method],
    )


def watched(llm: Any, prompts: list[str] | None = None, budgets: list[int] | None = None) -> Any:
    """One generate call of `llm` under the watch: the trace (written nowhere)."""
    from vllm import SamplingParams

    from specviz.watch.vllm import VllmWatch

    prompts = prompts if prompts is not None else script_module().PROMPTS
    budgets = budgets if budgets is not None else BUDGETS[: len(prompts)]
    params = [SamplingParams(temperature=0, max_tokens=b) for b in budgets]
    with VllmWatch(name="vllm-test") as watch:
        llm.generate(prompts, params, use_tqdm=False)
    return watch.trace
