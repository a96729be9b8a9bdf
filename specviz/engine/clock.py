"""The one device-synchronised clock: phase timings and wall times mean what they say on CUDA."""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a host sync on CUDA; nothing on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device) -> float:
    """`time.perf_counter()` after the device's queued work has finished."""
    synchronize(device)
    return time.perf_counter()
