#!/usr/bin/env bash
# Opt-in: makes .venv-torch, PyPI torch 2 and transformers 5 for the half of
# tests/engine/transformers_reference_test.py that Debian's torch 1.13 (.venv-hf) cannot run
# (Qwen3 and Gemma 3 need transformers >= 4.51), with the pinned scripts/requirements-torch.txt.
# Idempotent and quick when it is up to date. Run scripts/setup.sh first (Debian's python3 and
# python3-venv).
#
# Not part of scripts/setup.sh: PyPI's Linux torch is the CUDA build. Installed without the GPU
# compiler and the CUDA libraries nothing on the CPU loads (see requirements-torch.txt), it is
# still about 4.3 GB (the CUDA libraries torch is linked against are 2.9 GB of it) and about
# 2 minutes of downloads. Nothing is cached (pip --no-cache-dir).
#
# Environment: TANDEM_TORCH_VENV (default .venv-torch), TANDEM_SETUP_PYTHON (default
# /usr/bin/python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TANDEM_TORCH_VENV:-$ROOT/.venv-torch}"
REQUIREMENTS="$ROOT/scripts/requirements-torch.txt"
# Free space needed to install: 4.3 GB installed plus the largest wheel while it unpacks.
NEED_KIB=$((6 * 1024 * 1024))

TAG=setup_torch
# shellcheck source=scripts/optin_venv.sh
source "$ROOT/scripts/optin_venv.sh"
parent="$(dirname "$VENV")"
free_kib="$(df -Pk "$parent" | awk 'NR == 2 { print $4 }')"
if [ ! -d "$VENV" ] && [ "$free_kib" -lt "$NEED_KIB" ]; then
  die "$((free_kib / 1024 / 1024)) GiB free under $parent; $VENV needs about 6 GiB to install" \
    "free some space, or set TANDEM_TORCH_VENV to a path on a larger disk"
fi
optin_venv_create
say "installing scripts/requirements-torch.txt into $VENV (about 4.3 GB)"
# --no-deps: the file lists everything wanted, and torch's CUDA-only requirements are left out.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir --no-deps \
  -r "$REQUIREMENTS" ||
  die "pip could not install scripts/requirements-torch.txt into $VENV" \
    "see pip's message above; check that PyPI is reachable from this machine"
# A forward pass on the CPU, without the caller's library path, loading only what the
# environment and the system's own directories hold (nothing from a CUDA installation).
env -u LD_LIBRARY_PATH -u LD_PRELOAD "$VENV/bin/python" - "$VENV" <<'PY' ||
import os, re, sys
import torch, transformers
from transformers import Gemma3ForCausalLM, Qwen3ForCausalLM  # noqa: F401 (the reason for this venv)
x = torch.randn(8, 8)
assert torch.isfinite(x @ x).all()
venv = os.path.realpath(sys.argv[1]) + "/"
loaded = set(re.findall(r"(/\S+\.so[.0-9]*)$", open("/proc/self/maps").read(), re.M))
foreign = sorted(p for p in loaded if not os.path.realpath(p).startswith(
    (venv, "/usr/lib/", "/lib/", os.path.realpath(sys.base_prefix) + "/lib/")))
if foreign:
    sys.exit(f"torch loaded libraries from outside {venv} and /usr/lib: {foreign}")
print(f"torch {torch.__version__}, transformers {transformers.__version__}")
PY
  die "$VENV cannot run torch on the CPU with only its own libraries" "see the message above"
optin_venv_done "done: TANDEM_TORCH=1 ctest --preset release -R transformers_torch_test runs the test"
