#!/usr/bin/env bash
# The simulator's scale benchmark (issue 29): 10,000 workers (2,000 prefill + 8,000 decode,
# bench/sim/scale_cluster.json: least_loaded, router cells of 50) and 1,000,000 requests made in
# C++: Poisson at 100,000/s (SIM_SCALE_RATE), prompts of 128..384 tokens whose first 128 are
# shared by one of 100 groups, outputs of 32..96 tokens. One core: the simulator is
# single-threaded (SIM_SCALE_CPU=N pins it to CPU N). Prints tandem_sim's summary line (wall
# seconds, peak RSS, events, steps, the allocator: mimalloc with huge pages when the build found
# libmimalloc-dev) and /usr/bin/time's user seconds and maximum RSS.
# docs/performance.md has the figures.
#
#   bench/sim_scale.sh [build/release/bin/tandem_sim] [tandem_sim flags, e.g. --fast_decode=false]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-$here/../build/release/bin/tandem_sim}"
shift || true
requests="${SIM_SCALE_REQUESTS:-1000000}"
rate="${SIM_SCALE_RATE:-100000}"
pin=()
if [[ -n "${SIM_SCALE_CPU:-}" ]]; then pin=(taskset -c "$SIM_SCALE_CPU"); fi
exec /usr/bin/time -f '{"user_seconds": %U, "system_seconds": %S, "max_rss_kb": %M}' \
  "${pin[@]}" "$bin" --cluster="$here/sim/scale_cluster.json" \
  --synthetic="requests=$requests,rate=$rate,prompt=256,output=64,prefix_groups=100,prefix_tokens=128" \
  --seed=1 --summary "$@"
