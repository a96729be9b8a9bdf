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


def eagle_head(folder: Path) -> Path:
    """An EAGLE-1 head for the default target, made here (no download): the target's layer 0 and
    embeddings, a random fc (seeded). It drafts badly and that is enough: vLLM runs it, and what
    it accepts the check judges."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    target = script_module().ASSETS / "default-target"
    config = json.loads((target / "config.json").read_text())
    config["num_hidden_layers"] = 1
    weights = load_file(target / "model.safetensors")
    head = {k.removeprefix("model."): v for k, v in weights.items() if k.startswith("model.layers.0.")}
    head.pop("layers.0.input_layernorm.weight")  # EAGLE-1's first layer has no input norm
    hidden = config["hidden_size"]
    head["fc.weight"] = torch.randn(hidden, 2 * hidden, generator=torch.Generator().manual_seed(0)) * 0.02
    head["embed_tokens.weight"] = weights["model.embed_tokens.weight"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(head, folder / "model.safetensors")
    return folder


def make_llm(method: str, eagle_folder: Path | None = None) -> Any:
    """One engine: a method of the user's script, or `eagle` (a head made under `eagle_folder`)."""
    from vllm import LLM

    script = script_module()
    if method == "eagle":
        head = eagle_head(eagle_folder)
        speculation = {"method": "eagle", "model": str(head), "num_speculative_tokens": 3}
    else:
        speculation = script.SPECULATION[method]
    return LLM(
        model=str(script.ASSETS / "default-target"),
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,
        max_num_seqs=8,
        kv_cache_memory_bytes=KV_BYTES,
        speculative_config=speculation,
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
