#!/usr/bin/env bash
# Builds llama.cpp's llama-bench and llama-batched-bench once per machine, for bench/engine_bench.
#
# The sources come from the llama-cpp-python 0.3.36 sdist (vendor/llama.cpp), which pins the
# llama.cpp revision the reference tests already use. The build is cached under
#   ${TANDEM_CACHE:-~/.cache/tandem}/llama.cpp/<version>/
# and the script prints the directory holding the binaries (last line of stdout).
#
# Usage: bench/build_llama_cpp.sh [--sdist PATH] [--jobs N]
#   --sdist PATH  use this llama_cpp_python-0.3.36.tar.gz instead of downloading it
#                 (default: /tmp/lcp/llama_cpp_python-0.3.36.tar.gz if present, else pip download)
#   --jobs N      parallel compile jobs (default: nproc)
# Environment: PYTHON (default: <repo>/.venv/bin/python, else python3) for the pip download.
# Takes ~10 minutes of CPU the first time; run it under `nice` on a shared machine.
set -euo pipefail

VERSION=0.3.36
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_ROOT="${TANDEM_CACHE:-$HOME/.cache/tandem}/llama.cpp/${VERSION}"
SDIST=""
JOBS="$(nproc)"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --sdist) SDIST="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

# For this CPU, without llama.cpp's AMX kernels: their Q4_1 matrix product crashes (SIGSEGV in
# ggml_backend_amx_mul_mat) on AMX hosts here, as in scripts/setup.sh's llama-cpp-python. A build
# made with other flags is made again.
ARCH_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
BIN_DIR="${CACHE_ROOT}/build/bin"
STAMP="${CACHE_ROOT}/build/.tandem-arch-flags"
if [[ -x "${BIN_DIR}/llama-bench" && -x "${BIN_DIR}/llama-batched-bench" &&
      "$(cat "${STAMP}" 2>/dev/null)" == "${ARCH_FLAGS}" ]]; then
  echo "${BIN_DIR}"
  exit 0
fi
rm -rf "${CACHE_ROOT}/build"

mkdir -p "${CACHE_ROOT}"
if [[ -z "${SDIST}" ]]; then
  if [[ -f "/tmp/lcp/llama_cpp_python-${VERSION}.tar.gz" ]]; then
    SDIST="/tmp/lcp/llama_cpp_python-${VERSION}.tar.gz"
  elif [[ -f "${CACHE_ROOT}/llama_cpp_python-${VERSION}.tar.gz" ]]; then
    SDIST="${CACHE_ROOT}/llama_cpp_python-${VERSION}.tar.gz"
  else
    PYTHON="${PYTHON:-${REPO_ROOT}/.venv/bin/python}"
    [[ -x "${PYTHON}" ]] || PYTHON=python3
    echo "downloading llama-cpp-python==${VERSION} sdist" >&2
    "${PYTHON}" -m pip download --no-deps --no-binary=:all: "llama-cpp-python==${VERSION}" \
      -d "${CACHE_ROOT}" >&2
    SDIST="${CACHE_ROOT}/llama_cpp_python-${VERSION}.tar.gz"
  fi
fi

SRC_DIR="${CACHE_ROOT}/src"
if [[ ! -f "${SRC_DIR}/CMakeLists.txt" ]]; then
  rm -rf "${SRC_DIR}" "${CACHE_ROOT}/extract"
  mkdir -p "${CACHE_ROOT}/extract"
  tar -xzf "${SDIST}" -C "${CACHE_ROOT}/extract" \
    "llama_cpp_python-${VERSION}/vendor/llama.cpp"
  mv "${CACHE_ROOT}/extract/llama_cpp_python-${VERSION}/vendor/llama.cpp" "${SRC_DIR}"
  rm -rf "${CACHE_ROOT}/extract"
fi

GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
cmake -S "${SRC_DIR}" -B "${CACHE_ROOT}/build" "${GENERATOR[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
  -DCMAKE_C_FLAGS="${ARCH_FLAGS}" -DCMAKE_CXX_FLAGS="${ARCH_FLAGS}" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DGGML_OPENMP=ON >&2
cmake --build "${CACHE_ROOT}/build" --parallel "${JOBS}" \
  --target llama-bench llama-batched-bench >&2
echo "${ARCH_FLAGS}" >"${STAMP}"
echo "${BIN_DIR}"
