"""What the attacks aim at and what they must not break: the goals, asserted unless --no-assert."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose app.py is attacked by default
GOAL_GROWTH_MB = 1536
GOAL_SECONDS = 30
GOAL_PROBE_S = 3.0
# Issue 23: any accepted public upload costs at most this much server CPU (its first render
# included, the probe's requests meanwhile not) and keeps at most this much memory.
GOAL_UPLOAD_CPU_S = 3.0
GOAL_UPLOAD_KEPT_MB = 300
PROBE_TRACE = "default-eqspec.json.gz"
UPLOAD_WALL_GUARD_S = 15  # not a goal: how long an attack of N uploads one after another may take, per upload
