#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (the `fuzz` preset: clang, AddressSanitizer + UBSan)
# and fuzzes each in turn, for the given time, starting from its seed corpus. One process at a
# time (no -jobs), so the machine's other cores stay free.
#
#   scripts/fuzz.sh [seconds per target] [target...]     default: 60 seconds, every target
#
# TANDEM_FUZZ_RUNS=N stops a target after N executions if that comes first (e.g. 1000000 with a
# generous time, for the "each target ran a million inputs clean" check of docs/security.md).
# New inputs that reach new code go to build/fuzz/corpus/<target>/ (kept between runs; the seeds
# in tests/fuzz/corpus/<target>/ are only read). A crash, leak, sanitizer report or timeout stops
# that target: libFuzzer writes the input as build/fuzz/artifacts/<target>/crash-* (or leak-,
# timeout-, oom-) and this script says so and exits non-zero after the other targets.
# Chat templates also start from the real templates of scripts/fetch_chat_templates.sh when they
# are on this machine. TANDEM_JOBS sets the build parallelism (default: the number of cores).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_PER_TARGET="${1:-60}"
shift || true
JOBS="${TANDEM_JOBS:-$(nproc)}"
BUILD="$ROOT/build/fuzz"
ALL_TARGETS=(openai_json gguf hf_tokenizer chat_template tokenizer safetensors hf_config
             proto_conversion worker_view kv_descriptor)
if [ "$#" -gt 0 ]; then TARGETS=("$@"); else TARGETS=("${ALL_TARGETS[@]}"); fi

# Longest input per target, bytes: large enough for its seeds' shapes (a GGUF with a small
# vocabulary, a tokenizer.json), small enough to keep executions fast.
max_len() {
  case "$1" in
    gguf) echo 65536 ;;
    hf_tokenizer) echo 65536 ;;
    chat_template) echo 16384 ;;
    *) echo 8192 ;;
  esac
}

cd "$ROOT"
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
echo "[fuzz] configuring and building (preset fuzz, $JOBS jobs)"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$JOBS" >/dev/null

failed=()
for target in "${TARGETS[@]}"; do
  binary="$BUILD/fuzz/${target}_fuzz"
  [ -x "$binary" ] || { echo "[fuzz] no target '$target' (have: ${ALL_TARGETS[*]})" >&2; exit 2; }
  corpus="$BUILD/corpus/$target"
  artifacts="$BUILD/artifacts/$target"
  mkdir -p "$corpus" "$artifacts"
  seeds=("$ROOT/tests/fuzz/corpus/$target")
  templates="${XDG_CACHE_HOME:-$HOME/.cache}/tandem/chat-templates"
  if [ "$target" = chat_template ] && [ -d "$templates" ]; then
    while IFS= read -r dir; do seeds+=("$dir"); done < <(find "$templates" -mindepth 1 -maxdepth 1 -type d)
  fi
  log="$BUILD/artifacts/$target.log"
  echo "[fuzz] $target: ${SECONDS_PER_TARGET}s, -max_len=$(max_len "$target")"
  set +e
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$binary" -max_total_time="$SECONDS_PER_TARGET" -max_len="$(max_len "$target")" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -runs="${TANDEM_FUZZ_RUNS:--1}" \
    -artifact_prefix="$artifacts/" "$corpus" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  set -e
  runs="$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)"
  speed="$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)"
  if [ "$rc" -eq 0 ]; then
    echo "[fuzz] $target: clean, ${runs:-?} executions (${speed:-?}/s), corpus $(find "$corpus" -type f | wc -l) files"
  else
    echo "[fuzz] $target: FAILED (exit $rc) after ${runs:-?} executions; log $log" >&2
    grep -E 'ERROR: |runtime error:|SUMMARY:|Test unit written' "$log" | head -5 >&2 || true
    failed+=("$target")
  fi
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "[fuzz] failed: ${failed[*]}" >&2
  exit 1
fi
