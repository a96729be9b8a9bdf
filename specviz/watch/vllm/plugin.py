"""vLLM's general plugin (entry point group `vllm.general_plugins`), loaded in every vLLM process: inert
unless `SPECVIZ_VLLM_RECORD` names a folder (set by `specviz watch` and `VllmWatch` before vLLM starts),
where it wraps the model runner (`capture.install`), in an engine core process too."""

import os

from specviz.watch.vllm import ENV


def register() -> None:
    if os.environ.get(ENV):
        from specviz.watch.vllm import capture

        capture.install(os.environ[ENV])
