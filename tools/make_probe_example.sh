#!/usr/bin/env bash
# Regenerates the bundled probe reports, against the tests' server (tests/support/probe_server.py:
# the embedded target, bfloat16 batches vs float32 singles):
#   traces/probe-example.json  one URL, alone vs concurrency 8: numerical
#   traces/probe-sweep.json    a speculative server (placeholder logprobs for drafted tokens,
#                              llama-server telemetry, acceptance that collapses in a batch),
#                              swept over concurrency 1,2,4,8 for 3 rounds
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
python -m specviz probe "http://127.0.0.1:$port/numerical/legacy/v1" --quiet \
  --num-prompts 16 --max-tokens 16 --concurrency 8 --out traces/probe-example.json --force
python -m specviz probe "http://127.0.0.1:$port/numerical+spec+ph+collapse+llama/content/v1" --quiet \
  --num-prompts 12 --max-tokens 16 --concurrency 1,2,4,8 --rounds 3 --out traces/probe-sweep.json --force \
  || [ $? -eq 1 ]  # the collapse exits 1: that is the example
