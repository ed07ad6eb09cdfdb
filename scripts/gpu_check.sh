#!/usr/bin/env bash
# The CUDA checks on a GPU machine, in one call (the device tool: a bare machine with nvcc, CMake,
# ninja and PyTorch; no Debian dev packages, no network). Builds engine/cuda standalone, runs the
# kernel checks, compute-sanitizer (memcheck, racecheck) over them, the kernels' benchmark and
# PyTorch's figures on the same shapes (bench/cuda_torch_peer.py), and writes a summary to
# $OUT/gpu_check_summary.txt (or ./gpu_check_summary.txt) with every stage's log beside it. Each
# stage has a time limit, and all of them together at most 7.5 minutes.
#
#   scripts/gpu_check.sh            # from the repository root
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-$PWD}"
SUMMARY="$OUT_DIR/gpu_check_summary.txt"
BUILD=build/gpu
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
DEADLINE=$((SECONDS + 450))
stage() {  # stage NAME SECONDS COMMAND...: at most SECONDS, and never past DEADLINE
  local name=$1 limit=$2; shift 2
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -le 5 ]; then say "$name: not run (out of time)"; return 124; fi
  [ "$limit" -gt "$left" ] && limit=$left
  local log="$OUT_DIR/gpu_check_$name.log"
  local start=$SECONDS
  timeout "$limit" "$@" > "$log" 2>&1
  local rc=$?
  say "$name: rc=$rc in $((SECONDS - start)) s (log: $(basename "$log"))"
  tail -n 15 "$log" | sed 's/^/    /' >> "$SUMMARY"
  return $rc
}

say "gpu_check $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$SUMMARY"
nvcc --version | tail -1 | sed 's/^/nvcc: /' | tee -a "$SUMMARY"

stage configure 120 cmake -S engine/cuda/standalone -B "$BUILD" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 || { say "FAILED: configure"; exit 1; }
stage build 200 ninja -C "$BUILD" || { say "FAILED: build"; exit 1; }
stage checks 60 "$BUILD/cuda_kernels_check"
checks=$?
if command -v compute-sanitizer > /dev/null; then
  stage memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD/cuda_kernels_check"
  stage racecheck 90 compute-sanitizer --tool racecheck --error-exitcode 3 "$BUILD/cuda_kernels_check"
else
  say "compute-sanitizer: not found"
fi
stage bench 90 "$BUILD/cuda_kernels_bench"
if python3 -c "import torch; assert torch.cuda.is_available()" 2> /dev/null; then
  stage torch_peer 60 python3 bench/cuda_torch_peer.py
else
  say "torch_peer: PyTorch with CUDA not found"
fi
say "done: checks rc=$checks"
exit $checks
