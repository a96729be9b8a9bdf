#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (only that target) from the llama.cpp vendored in the
# llama-cpp-python sdist, into ~/.cache/specviz/llama.cpp/ (outside the repo), and reuses it.
#   tools/build_llama_server.sh [LLAMA_CPP_PYTHON_VERSION]     # prints the binary's path
# ~190 compile units, once (JOBS=N for more); then instant. Timed 2026-12-06 (`/usr/bin/time -v nice -n 15
# env JOBS=2 tools/build_llama_server.sh`, 2 cores shared with ~8 other jobs): 815 s of CPU (759 user,
# 56 system), 71 min of wall clock at 19% of the CPU; on two idle cores that is an estimated 7 min (not measured). E.g.:
#   llama-server -m model.gguf --parallel 4 --port 8080 &
#   python -m specviz probe http://127.0.0.1:8080/v1 --concurrency 4 --logprobs 5
set -euo pipefail
version="${1:-0.3.36}"  # pinned: the flags below are checked against this version
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
  pip download --no-deps --no-binary llama-cpp-python -d "$sdist_dir" "llama-cpp-python${version:+==$version}" >&2
  tar -xzf "$sdist_dir"/llama_cpp_python-*.tar.gz -C "$sdist_dir"
  rm -rf "$cache/src"
  cp -r "$sdist_dir"/llama_cpp_python-*/vendor/llama.cpp "$cache/src"
fi
# Options as in the vendored llama.cpp of llama-cpp-python 0.3.36 (its CMakeLists.txt, tools/,
# tools/ui/, vendor/cpp-httplib/):
#   GGML_NATIVE=OFF          portable: not -march=native of the building machine. A native build
#                            here dies with "Illegal instruction" at model load (the machine
#                            that runs it may lack an extension the builder has, e.g. AVX-512)
#   GGML_AVX2, FMA, F16C=ON  named explicitly (ggml's defaults with NATIVE=OFF, but a default can
#                            move between versions): AVX2-class x86-64, no AVX-512
#   LLAMA_BUILD_TOOLS=ON     llama-server lives in tools/server (tools/ adds it with LLAMA_BUILD_SERVER)
#   LLAMA_BUILD_APP=OFF      not the unified `llama` binary; TESTS, EXAMPLES off as well
#   LLAMA_USE_PREBUILT_UI=OFF, LLAMA_BUILD_UI=OFF   no web UI: otherwise the build downloads it from a
#                            Hugging Face bucket (or runs npm); offline it would wait for a timeout
#   LLAMA_OPENSSL=OFF        loopback HTTP only, no libssl dependency
#   LLAMA_CURL=OFF           deprecated and ignored there (a warning); kept for older versions
#   BUILD_SHARED_LIBS=OFF    one self-contained binary
cmake -S "$cache/src" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX512=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DBUILD_SHARED_LIBS=OFF -DGGML_CCACHE=OFF >&2
# Only the llama-server target (and what it links: ggml, llama, common, mtmd, the server libraries).
cmake --build "$cache/build" --target llama-server -j "${JOBS:-2}" >&2
echo "$binary"
