"""vLLM's general plugin (entry point group `vllm.general_plugins`), loaded in every vLLM process.

Inert unless the watch asks: only where `SPECVIZ_VLLM_RECORD` names a folder does it wrap the model
runner (`capture.install`). `specviz watch` and `VllmWatch` set it before vLLM starts, so an engine
core in its own process (`VLLM_ENABLE_V1_MULTIPROCESSING=1`) records too.
"""

from __future__ import annotations

import os

from specviz.watch.vllm import ENV


def register() -> None:
    folder = os.environ.get(ENV)
    if folder:
        from specviz.watch.vllm import capture

        capture.install(folder)
