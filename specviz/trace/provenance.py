"""Where a trace came from: library versions and model descriptions, for every trace writer (run, watch)."""

from __future__ import annotations

from typing import Any

import torch

from specviz import __version__
from specviz.trace.schema import ModelInfo


def library_versions() -> dict[str, str]:
    import transformers

    return {"specviz": __version__, "torch": torch.__version__, "transformers": transformers.__version__}


def model_info(
    model: Any, name: str | None = None, device: torch.device | None = None, dtype: torch.dtype | None = None
) -> ModelInfo:
    """`name`, `device` and `dtype` as given, else read off the model (its config's path, its parameters)."""
    param = next(model.parameters()) if device is None or dtype is None else None
    return ModelInfo(
        name=name if name is not None else str(getattr(model.config, "_name_or_path", "") or type(model).__name__),
        dtype=str(dtype if dtype is not None else param.dtype).replace("torch.", ""),
        device=str(device if device is not None else param.device),
        vocab_size=int(model.get_output_embeddings().weight.shape[0]),
        num_parameters=int(sum(p.numel() for p in model.parameters())),
    )
