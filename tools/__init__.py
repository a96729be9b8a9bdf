"""Maintenance scripts, run from the repository root as modules: `python -m tools.make_traces`."""
