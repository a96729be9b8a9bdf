"""The user's script (offline_script.py) with one real bug injected into vLLM first, for the docs'
walkthrough (docs/vllm.md): `python faulty_script.py FAULT [METHOD]`, FAULT one of
tests/support/vllm_faults.py's. The patch lives in this process: run it with
VLLM_ENABLE_V1_MULTIPROCESSING=0."""

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    faults = _load("vllm_faults", HERE.parent / "support" / "vllm_faults.py")
    script = _load("offline_script", HERE / "offline_script.py")
    with pytest.MonkeyPatch.context() as patch:
        log = faults.inject(sys.argv[1], patch)
        script.main(sys.argv[2] if len(sys.argv) > 2 else "draft_model")
    print(f"{sys.argv[1]} first changed vLLM's decision at (runner step, row, request) {log.events[:1]}")
