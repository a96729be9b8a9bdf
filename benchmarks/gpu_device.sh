#!/usr/bin/env bash
# benchmarks/gpu_bench.py on the lent H200, as the one command the `device` tool runs (no network
# there; its image has torch 2.11 and transformers 5.17, and pandas but no plotly or gradio, which
# the bench does not import). The project pins transformers 5.24: carry its wheel (13.5 MB).
#
# Here, once per checkout (.whl/ is ignored by git):
#   pip download --no-deps -d .whl transformers==5.24.0
# Then, with the device tool:
#   run(command="bash benchmarks/gpu_device.sh", carry=[".whl"], timeout_s=540)
# (`bash benchmarks/gpu_device.sh --tiny` runs the same path here on CPU in seconds.)
# The table and log come back under $OUT; commit the table as benchmarks/results/gpu-h200-DATE.md.
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-deps --no-index .whl/*.whl
fi
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-bench-out}"
mkdir -p "$OUT"
python3 benchmarks/gpu_bench.py --out "$OUT/gpu-h200.md" "$@" 2>&1 | tee "$OUT/gpu-h200.log"
# Chain vs tree, head vs draft model, per method (issue 35), on the default pair and its head
# (12 arms + baseline, 2 batch sizes, 3 repeats: a few minutes on the H200). Not with --tiny.
if [[ " $* " != *" --tiny "* ]]; then
  python3 benchmarks/drafting.py --batch-sizes 1 32 --out "$OUT/drafting-h200.md" 2>&1 | tee "$OUT/drafting-h200.log"
fi
