"""Where a measurement ran: machine, threads, versions and load, for the provenance of every result."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

from specviz.engine.models import ModelPair
from specviz.trace.naming import now_iso


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None where the platform has none."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def machine_info(pair: ModelPair) -> dict[str, Any]:
    import transformers

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(pair.device),
        "dtype": str(pair.dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "target": pair.target_name,
        "draft": pair.draft_name,
        "load_average_start": load_average(),
    }
    if pair.device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(pair.device)
    return info


def provenance(command: str) -> str:
    """One markdown line for a results file: date, machine, threads, versions, command."""
    import transformers

    return (
        f"- {now_iso()}; {platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
        f"load average {load_average()}; torch {torch.__version__}, transformers {transformers.__version__}; "
        f"`{command}`"
    )
