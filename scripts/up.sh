#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), builds Tandem and starts the local cluster on the default
# model with `tandem up`. Arguments are passed to `tandem up` (try --help).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${TANDEM_JOBS:-$(nproc)}"

"$ROOT/scripts/setup.sh"
cd "$ROOT"
# Let ccache reuse objects compiled in another checkout of the same sources.
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
cmake --preset release >/dev/null
cmake --build --preset release -j "$JOBS"
exec "$ROOT/build/release/bin/tandem" up "$@"
