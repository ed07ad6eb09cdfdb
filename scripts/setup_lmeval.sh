#!/usr/bin/env bash
# Opt-in: makes .venv-lmeval, the environment of lm-evaluation-harness (PyPI lm-eval) for
# tests/eval/lm_eval_test.py, with the pinned scripts/requirements-lmeval.txt. Idempotent and quick
# when it is up to date. Run scripts/setup.sh first (Debian's python3 and python3-venv).
#
# Not part of scripts/setup.sh: it adds about 0.9 GB (datasets, pyarrow, pandas, scipy,
# scikit-learn, transformers) and 40 s to 1.5 min of downloads for one test. No torch: lm-eval's
# local-completions model needs none (see scripts/requirements-lmeval.txt).
#
# Environment: TANDEM_LMEVAL_VENV (default .venv-lmeval), TANDEM_SETUP_PYTHON (default
# /usr/bin/python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TANDEM_LMEVAL_VENV:-$ROOT/.venv-lmeval}"
REQUIREMENTS="$ROOT/scripts/requirements-lmeval.txt"

TAG=setup_lmeval
# shellcheck source=scripts/optin_venv.sh
source "$ROOT/scripts/optin_venv.sh"
optin_venv_create
say "installing scripts/requirements-lmeval.txt into $VENV (about 0.9 GB)"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQUIREMENTS" ||
  die "pip could not install scripts/requirements-lmeval.txt into $VENV" \
    "see pip's message above; check that PyPI is reachable from this machine"
"$VENV/bin/python" -c 'import lm_eval, lm_eval.models.openai_completions, transformers, gguf' ||
  die "$VENV cannot import lm_eval, transformers and gguf" "see the message above"
if "$VENV/bin/python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)'; then
  die "$VENV has torch, which scripts/requirements-lmeval.txt should not bring in" \
    "check what required it: $VENV/bin/python -m pip show torch"
fi
optin_venv_done "done: TANDEM_LM_EVAL=1 ctest --preset release -R lm_eval_test runs the test"
