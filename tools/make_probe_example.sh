#!/usr/bin/env bash
# Regenerates traces/probe-example.json: `specviz probe` against the tests' numerical server
# (tests/support/probe_server.py: the embedded target, bfloat16 batches vs float32 singles).
#   tools/make_probe_example.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
fifo=$(mktemp -u) && mkfifo "$fifo"
python tests/support/probe_server.py >"$fifo" 2>/dev/null &
server=$!
trap 'kill $server 2>/dev/null; rm -f "$fifo"' EXIT
read -r ready port <"$fifo"  # the readiness handshake: "READY <port>"
[ "$ready" = READY ]
python -m specviz probe "http://127.0.0.1:$port/numerical/legacy/v1" \
  --num-prompts 16 --max-tokens 16 --concurrency 8 --out traces/probe-example.json --force
