#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), builds Tandem and runs the whole test suite with CTest.
#
#   scripts/test.sh [preset]     preset: release (default), debug, asan or tsan
#
# TANDEM_JOBS sets the build parallelism (default: the number of cores).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PRESET="${1:-release}"
JOBS="${TANDEM_JOBS:-$(nproc)}"

"$ROOT/scripts/setup.sh"
cd "$ROOT"
# Let ccache reuse objects compiled in another checkout of the same sources.
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
echo "[test] configuring ($PRESET)"
cmake --preset "$PRESET" >/dev/null
echo "[test] building with $JOBS jobs"
cmake --build --preset "$PRESET" -j "$JOBS"
echo "[test] running the tests"
ctest --preset "$PRESET" -j "$JOBS"
