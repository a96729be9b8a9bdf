"""What the hooks read off a forward's tensors (masks, logits), each in one pass: pure functions of
tensors, on the CPU through numpy where cheaper (torch's single-threaded CPU reductions widen a
boolean to int64). `hooks` and `record` call them; `batchmap` and `follow` read the results."""

from __future__ import annotations

from typing import Any

import numpy
import torch

QUERY_TAIL = 128  # 4-D masks keep only their last query rows: a verify window is never longer
# Host dtypes numpy reads in place: its compare and `any` over a mask cost a fifth of torch's.
NUMPY_DTYPES = {torch.bool, torch.float16, torch.float32, torch.float64, torch.uint8, torch.int8, torch.int16}
NUMPY_DTYPES |= {torch.int32, torch.int64}


def line_summary(mask: torch.Tensor) -> list[tuple[int, bool, bool, bool]]:
    """Per query token of a packed row's [T, keys] mask: (slots it attends, drops one the token
    before attended, continues that token: shares a slot and gains exactly one, its own key, as a
    causal query or a sliding window does; attends exactly one more). The first token drops
    nothing and continues (no token before it)."""
    counts, both = (numpy.asarray(a, dtype=numpy.int64) for a in line_counts(mask.bool()))
    if not len(counts):  # a mask of no tokens
        return []
    dropped = both < counts[:-1]  # [T - 1]: per token from the second on
    one = counts[1:] - both == 1  # it gains exactly one slot
    continues, grows = (both > 0) & one, ~dropped & one
    first = (int(counts[0]), False, True, bool(counts[0] > 0))
    return [first, *zip(counts[1:].tolist(), dropped.tolist(), continues.tolist(), grows.tolist())]


def line_counts(seen: torch.Tensor, host: bool | None = None) -> tuple[list[int], list[int]]:
    """Per line of a [T, keys] boolean mask: slots attended, and slots shared with the line before
    (T - 1 of them); through numpy on the CPU, else two ops and one transfer (`host` forces one)."""
    if seen.device.type == "cpu" if host is None else host:
        lines = seen.numpy()
        counts = lines.view(numpy.uint8).sum(-1, dtype=numpy.int32)
        both = (lines[:-1] & lines[1:]).view(numpy.uint8).sum(-1, dtype=numpy.int32)
        return counts.tolist(), both.tolist()
    read = torch.cat([seen.sum(-1), (seen[:-1] & seen[1:]).sum(-1)]).tolist()
    return read[: len(seen)], read[len(seen) :]


def segment_slots(mask: Any, segments: list[tuple[int, int, int]]) -> list[tuple[Any, Any]]:
    """Per sequence (row, start, length) of a packed row's [T, keys] boolean mask (numpy, or a CPU
    tensor): the key slots its first and its last query tokens attend, as numpy rows (one gather)."""
    picked = numpy.asarray(mask)[[t for _, start, n in segments for t in (start, start + n - 1)]]
    return list(zip(picked[0::2], picked[1::2]))


def shared_slots(a: Any, b: Any) -> int:
    """Key slots two `CallRecord.held` rows both attend (a later call's keys may be more)."""
    n = min(len(a), len(b))
    return int(numpy.count_nonzero(a[:n] & b[:n]))


def mask_copy(mask: Any, tail: int | None = QUERY_TAIL) -> tuple[str, torch.Tensor | None, torch.Tensor | None]:
    """The mask's kind, its "may attend" booleans (a copy; of a 4-D mask head 0's last `tail` query
    rows, all for None) and, for a 4-D tail, whether each query slot attends anything ([B, q])."""
    if not isinstance(mask, torch.Tensor) or mask.dim() not in (2, 4):
        return ("none" if mask is None else "unknown"), None, None
    if mask.dim() == 2:
        return "2d", _copied(attended(mask), mask), None
    seen = attended(mask[:, 0])
    if tail is None:  # whole (a packed row): `CallRecord.materialize` reads its lines at close
        return "4d", _copied(seen, mask), None
    return "4d", seen[:, -tail:].clone(), any_last(seen)  # a copy: the other rows are not kept alive


def _copied(seen: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`attended(mask)` as a tensor of our own: a bool mask's is the engine's (copied), any other's new."""
    return seen.clone() if mask.dtype == torch.bool else seen


def on_host(tensor: torch.Tensor, least: int = 0) -> Any:
    """A numpy view of a CPU tensor numpy reads, of `least` elements or more (fewer: not worth it); else None."""
    if tensor.device.type != "cpu" or tensor.dtype not in NUMPY_DTYPES or tensor.numel() < least:
        return None
    try:
        return tensor.detach().numpy()
    except RuntimeError:  # a lazy conjugate or negated view, a subclass: torch's own op then
        return None


def through_host(tensor: torch.Tensor, op: Any, least: int = 0) -> torch.Tensor:
    """`op(tensor)`, written for both, through numpy where `on_host` reads it, else torch's own."""
    host = on_host(tensor, least)
    return torch.from_numpy(op(host)) if host is not None else op(tensor)


def attended(mask: torch.Tensor) -> torch.Tensor:
    """Boolean 'may attend' of a bool (as is), 0/1 or additive float mask (0 attends)."""
    if mask.dtype == torch.bool:
        return mask
    floating = mask.is_floating_point()
    return through_host(mask, lambda m: m == 0 if floating else m != 0, least=4096)


def argmax_of(logits: torch.Tensor) -> torch.Tensor:
    """`logits.argmax(-1)` (the first maximum), through numpy on the CPU: a tenth of torch's cost."""
    return through_host(logits, lambda x: x.argmax(-1))


def any_last(seen: torch.Tensor) -> torch.Tensor:
    """`seen.any(-1)`, through numpy on the CPU."""
    return through_host(seen, lambda x: x.any(-1))
