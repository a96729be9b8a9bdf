#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (only that target) from the llama.cpp vendored in the
# llama-cpp-python sdist, into ~/.cache/specviz/llama.cpp/ (outside the repo), and reuses it.
#   tools/build_llama_server.sh [LLAMA_CPP_PYTHON_VERSION]     # prints the binary's path
# ~12+ minutes of two cores on first build; afterwards instant. Then, e.g.:
#   llama-server -m model.gguf --parallel 4 --port 8080 &
#   python -m specviz probe http://127.0.0.1:8080/v1 --concurrency 4 --logprobs 5
set -euo pipefail
version="${1:-}"
cache="${SPECVIZ_CACHE:-$HOME/.cache/specviz}/llama.cpp"
binary="$cache/build/bin/llama-server"
if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi
mkdir -p "$cache"
if [ ! -f "$cache/src/CMakeLists.txt" ]; then
  sdist_dir=$(mktemp -d)
  trap 'rm -rf "$sdist_dir"' EXIT
  pip download --no-deps --no-binary :all: -d "$sdist_dir" "llama-cpp-python${version:+==$version}" >&2
  tar -xzf "$sdist_dir"/llama_cpp_python-*.tar.gz -C "$sdist_dir"
  rm -rf "$cache/src"
  cp -r "$sdist_dir"/llama_cpp_python-*/vendor/llama.cpp "$cache/src"
fi
cmake -S "$cache/src" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >&2
cmake --build "$cache/build" --target llama-server -j "${JOBS:-2}" >&2
echo "$binary"
