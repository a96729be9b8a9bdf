"""What the hooks read off a forward's tensors (masks, logits), each in one pass, on the host
through numpy where that is cheaper (torch's single-threaded CPU reductions widen a boolean to
int64). Pure functions of tensors: `hooks` calls them, `batchmap` and `follow` read the results."""

from __future__ import annotations

from typing import Any

import numpy
import torch

QUERY_TAIL = 128  # 4-D masks keep only their last query rows: a verify window is never longer


def line_summary(mask: torch.Tensor) -> list[tuple[int, bool, bool, bool]]:
    """Per query token of a packed row's [T, keys] mask: (slots it attends, whether it drops one the
    token before attended, whether it continues that token, whether it attends exactly one more).
    From `line_counts`: with `both` the slots shared with the token before, it drops one iff both <
    the count before and gains count - both; it continues iff both > 0 and it gains one (its own
    key, as a causal query or a sliding window does: a neighbour's first token gains its whole
    context even where a leaked slot is shared). In numpy: no Python loop over the T tokens."""
    counts, both = (numpy.asarray(a, dtype=numpy.int64) for a in line_counts(mask.bool()))
    if not len(counts):
        return []
    dropped = both < counts[:-1]  # [T - 1]: per token from the second on
    one = counts[1:] - both == 1  # it gains exactly one slot
    continues, grows = (both > 0) & one, ~dropped & one
    first = (int(counts[0]), False, True, bool(counts[0] > 0))
    return [first, *zip(counts[1:].tolist(), dropped.tolist(), continues.tolist(), grows.tolist())]


def line_counts(seen: torch.Tensor, host: bool | None = None) -> tuple[list[int], list[int]]:
    """Per line of a [T, keys] boolean mask: slots attended, and slots shared with the line before
    (T - 1 of them). Through numpy on the CPU (a packed prefill's mask is T x T); on a device, two
    ops and one transfer (`host` forces the one or the other)."""
    if seen.device.type == "cpu" if host is None else host:
        lines = seen.numpy()
        counts = lines.view(numpy.uint8).sum(-1, dtype=numpy.int32)
        both = (lines[:-1] & lines[1:]).view(numpy.uint8).sum(-1, dtype=numpy.int32)
        return counts.tolist(), both.tolist()
    t = seen.shape[0]
    read = torch.cat([seen.sum(-1), (seen[:-1] & seen[1:]).sum(-1)]).tolist()
    return read[:t], read[t:]


def segment_slots(mask: torch.Tensor, segments: list[tuple[int, int, int]]) -> list[tuple[Any, Any]]:
    """Per sequence of a packed row's [T, keys] mask: the key slots its first and its last query
    tokens attend, as boolean numpy rows (one gather for the whole call)."""
    ends = [t for _, start, length in segments for t in (start, start + length - 1)]
    picked = mask.bool().cpu().numpy()[ends]  # a copy: [2S, keys]
    return [(picked[2 * i], picked[2 * i + 1]) for i in range(len(segments))]


def shared_slots(a: Any, b: Any) -> int:
    """Key slots two `CallRecord.held` rows both attend (slot i is the same slot in every call of a
    shared cache; a later call's keys may be more)."""
    n = min(len(a), len(b))
    return int(numpy.count_nonzero(a[:n] & b[:n]))


def mask_copy(mask: Any, tail: int | None = QUERY_TAIL) -> tuple[str, torch.Tensor | None, torch.Tensor | None]:
    """The mask's kind, its "may attend" booleans (a copy; of a 4-D mask head 0's last `tail` query
    rows, all for None) and, for a 4-D tail, whether each query slot attends anything ([B, q])."""
    if mask is None:
        return "none", None, None
    if not isinstance(mask, torch.Tensor):
        return "unknown", None, None
    if mask.dim() == 2:
        return "2d", _copied(attended(mask), mask), None
    if mask.dim() == 4:
        seen = attended(mask[:, 0])
        # Whole (a packed row): `CallRecord.materialize` reads its lines at close. A tail is
        # copied, so the rest of the rows are not kept alive.
        if tail is None:
            return "4d", _copied(seen, mask), None
        return "4d", seen[:, -tail:].clone(), any_last(seen)
    return "unknown", None, None


def _copied(seen: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`attended(mask)` as a tensor of our own: a bool mask's is the engine's (copied), any other's new."""
    return seen.clone() if mask.dtype == torch.bool else seen


# Host dtypes numpy reads in place: its compare and `any` over a mask cost a fifth of torch's
# single-threaded ones, the hook's largest cost before.
NUMPY_DTYPES = {torch.bool, torch.float16, torch.float32, torch.float64}
NUMPY_DTYPES |= {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}


def on_host(tensor: torch.Tensor, least: int = 0) -> Any:
    """The tensor as a numpy view when on the CPU in a dtype numpy has, with `least` elements or
    more (below, the conversions cost what the op saves); else None."""
    if tensor.device.type != "cpu" or tensor.dtype not in NUMPY_DTYPES or tensor.numel() < least:
        return None
    try:
        return tensor.detach().numpy()
    except RuntimeError:  # a lazy conjugate or negated view, a subclass: torch's own op then
        return None


def _through_host(tensor: torch.Tensor, op: Any, least: int = 0) -> torch.Tensor:
    """`op(tensor)`, written for both, through numpy where `on_host` reads it (a new array, never a
    view of the engine's), else torch's own."""
    host = on_host(tensor, least)
    return torch.from_numpy(op(host)) if host is not None else op(tensor)


def attended(mask: torch.Tensor) -> torch.Tensor:
    """Boolean 'may attend' of a bool (as is), 0/1 or additive float mask (0 attends)."""
    if mask.dtype == torch.bool:
        return mask
    floating = mask.is_floating_point()
    return _through_host(mask, lambda m: m == 0 if floating else m != 0, least=4096)


def argmax_of(logits: torch.Tensor) -> torch.Tensor:
    """`logits.argmax(-1)` (the first maximum), through numpy on the CPU: a tenth of torch's cost."""
    return _through_host(logits, lambda x: x.argmax(-1))


def any_last(seen: torch.Tensor) -> torch.Tensor:
    """`seen.any(-1)`, through numpy on the CPU."""
    return _through_host(seen, lambda x: x.any(-1))
