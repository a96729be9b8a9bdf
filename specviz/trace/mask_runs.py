"""A fed mask row as the trace stores it (`mask_rle`: [[value, count], ...] runs), read without
expanding what the file declares: a run may claim 10^7 slots, and only the columns asked for are
ever materialised. Pure functions of trace data, shared by the analysis and the views."""

from __future__ import annotations


def expand_mask(mask_rle: list[list[int]], width: int) -> list[int | None]:
    """The fed mask row as a list of `width` entries; None where the mask is too short."""
    return mask_window(mask_rle, 0, width)


def mask_window(mask_rle: list[list[int]], lo: int, hi: int) -> list[int | None]:
    """Mask entries of columns lo..hi-1 (None past the mask's end), clipped before expanding.

    A run's count is what the file declares (a row may claim 10^7 slots): only the overlap of
    each run with the window is ever materialised.
    """
    values: list[int | None] = []
    pos = 0
    for value, count in mask_rle:
        start, end = max(pos, lo), min(pos + count, hi)
        if start < end:
            values.extend([value] * (end - start))
        pos += count
        if pos >= hi:
            break
    values.extend([None] * (hi - lo - len(values)))
    return values


def attended_before(mask_rle: list[list[int]], col: int) -> tuple[int, int | None]:
    """(attended slots before column `col`, first attended column or None), from the runs."""
    attended, first, pos = 0, None, 0
    for value, count in mask_rle:
        if pos >= col:
            break
        if value == 1 and count > 0:
            first = pos if first is None else first
            attended += min(pos + count, col) - pos
        pos += count
    return attended, first
