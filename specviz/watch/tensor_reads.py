"""What the hooks read off a forward's tensors, each in one pass and on the host through numpy
where that is cheaper (torch's single-threaded CPU reductions of a boolean widen it to int64): a
mask's "may attend" booleans (`mask_copy`, `attended`), the per-token summary of a packed row's
mask (`line_summary`, `line_counts`, `segment_slots`), the logits' argmax (`argmax_of`). Pure
functions of tensors: `hooks` calls them, `batchmap` and `follow` read what they return."""

from __future__ import annotations

from typing import Any

import numpy
import torch

QUERY_TAIL = 128  # 4-D masks keep only their last query rows: a verify window is never longer


def line_summary(mask: torch.Tensor) -> list[tuple[int, bool, bool, bool]]:
    """Per query token of a packed row's [T, keys] mask: how many slots it attends, whether it drops
    one the token before attended, whether it continues that token (shares a slot with it and gains
    exactly one: its own key, as a causal query or a sliding window does; a neighbour's first token
    gains its whole context even where a leaked slot is shared), and whether it attends exactly
    one slot more.

    All of it from two counts per token (`line_counts`): `count`, the slots it attends, and `both`,
    the slots it shares with the token before. It drops a slot iff both < the count before, gains
    count - both slots, continues iff both > 0 and it gains one, and attends exactly one more iff it
    drops none and gains one."""
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
    (T - 1 of them). On the host through numpy: torch's CPU reductions of a boolean widen it to
    int64, several times numpy's cost here (a packed prefill's mask is T x T); on a device, two
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
    """Per sequence of a packed row's [T, keys] mask: the key slots its first query token attends
    and those its last one attends, as boolean numpy rows (one gather for the whole call)."""
    ends = [t for _, start, length in segments for t in (start, start + length - 1)]
    picked = mask.bool().cpu().numpy()[ends]  # a copy: [2S, keys]
    return [(picked[2 * i], picked[2 * i + 1]) for i in range(len(segments))]


def shared_slots(a: Any, b: Any) -> int:
    """Key slots two `CallRecord.held` rows both attend (slot i is the same slot in every call of a
    shared cache; a later call's keys may be more)."""
    n = min(len(a), len(b))
    return int(numpy.count_nonzero(a[:n] & b[:n]))


def mask_copy(mask: Any, tail: int | None = QUERY_TAIL) -> tuple[str, torch.Tensor | None, torch.Tensor | None]:
    """The mask's kind, its "may attend" booleans (a copy, never a view of the engine's; a 4-D
    mask: head 0's last `tail` query rows, all of them for None, heads share the mask) and, for a
    4-D mask, whether each query slot attends anything ([B, q]). One pass over the mask for each."""
    if mask is None:
        return "none", None, None
    if not isinstance(mask, torch.Tensor):
        return "unknown", None, None
    if mask.dim() == 2:
        return "2d", _copied(attended(mask), mask), None
    if mask.dim() == 4:
        seen = attended(mask[:, 0])
        # Whole (a packed row): which query slots attend anything is then read at close, from the
        # summary of its lines (`CallRecord.materialize`). A tail is copied, so the rest of the
        # rows are not kept alive.
        if tail is None:
            return "4d", _copied(seen, mask), None
        return "4d", seen[:, -tail:].clone(), any_last(seen)
    return "unknown", None, None


def _copied(seen: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`attended(mask)` (or of a view of it) as a tensor of our own: a bool mask's is the engine's
    tensor or a view of it, copied; any other is a new tensor already."""
    return seen.clone() if mask.dtype == torch.bool else seen


# Host dtypes numpy reads in place. On the CPU, numpy's elementwise compare and `any` over a mask
# cost a fifth of torch's single-threaded ones (a packed prefill's mask is T x T): the hook's
# largest cost before this.
NUMPY_DTYPES = {torch.bool, torch.float16, torch.float32, torch.float64}
NUMPY_DTYPES |= {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}


def on_host(tensor: torch.Tensor, least: int = 0) -> Any:
    """The tensor as a numpy array (a view, no copy) when it is on the CPU in a dtype numpy has
    (and has `least` elements or more: below, the conversions cost what the op saves)."""
    if tensor.device.type != "cpu" or tensor.dtype not in NUMPY_DTYPES or tensor.numel() < least:
        return None
    try:
        return tensor.detach().numpy()
    except RuntimeError:  # a lazy conjugate or negated view, a subclass: torch's own op then
        return None


def _through_host(tensor: torch.Tensor, op: Any, least: int = 0) -> torch.Tensor:
    """`op(tensor)` through numpy where `on_host` reads the tensor (a new array then: never a view
    of the engine's), else torch's own op; `op` is written for both."""
    host = on_host(tensor, least)
    return torch.from_numpy(op(host)) if host is not None else op(tensor)


def attended(mask: torch.Tensor) -> torch.Tensor:
    """Boolean 'may attend' from a bool (returned as is), 0/1 or additive float mask (0 attends, a
    large negative number blocks)."""
    if mask.dtype == torch.bool:
        return mask
    floating = mask.is_floating_point()
    return _through_host(mask, lambda m: m == 0 if floating else m != 0, least=4096)


def argmax_of(logits: torch.Tensor) -> torch.Tensor:
    """`logits.argmax(-1)` (the first maximum), through numpy on the CPU: a tenth of torch's
    single-threaded cost over a vocabulary, the after-hook's one op."""
    return _through_host(logits, lambda x: x.argmax(-1))


def any_last(seen: torch.Tensor) -> torch.Tensor:
    """`seen.any(-1)`, through numpy on the CPU."""
    return _through_host(seen, lambda x: x.any(-1))
