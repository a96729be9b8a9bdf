"""Kept for the inferrer's imports (`infer/gains.py`, `infer/followed.py`): a row's tokens and their
fit now live in `calls.py`, the row an emission is credited to in `steps.py` (`assign_rows`)."""

from specviz.watch.calls import matched_prefix, row_tokens

__all__ = ["matched_prefix", "row_tokens"]
