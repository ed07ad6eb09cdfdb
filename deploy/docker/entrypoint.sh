#!/bin/sh
# tandem-entrypoint: the images' entrypoint. Starts one Tandem role configured by environment
# variables and a mounted model only, as Kubernetes starts it.
#
#   tandem-entrypoint router|prefill|decode [FLAGS...]
#   TANDEM_ROLE=router|prefill|decode tandem-entrypoint [FLAGS...]
#
# - The binary (tandem-router, tandem-prefill, tandem-decode) is taken from TANDEM_BIN_DIR
#   (default /opt/tandem/bin).
# - The model: TANDEM_MODEL (a GGUF file), or the default model file in TANDEM_MODELS_DIR; with
#   neither set, TANDEM_MODELS_DIR=/models, where the model volume is mounted. --model and
#   --models_dir among FLAGS count too. A missing or unreadable model is reported here, with what
#   to mount or set, and exits 1 before the binary starts.
# - Listen addresses, set only when the variable is unset: router TANDEM_HTTP_LISTEN=0.0.0.0:8000
#   (OpenAI HTTP, /health, /metrics) and TANDEM_LISTEN=0.0.0.0:7000 (gRPC); prefill and decode
#   TANDEM_LISTEN=0.0.0.0:7100 (gRPC) and TANDEM_METRICS_LISTEN=0.0.0.0:9100 (/metrics).
# - Everything else is a TANDEM_* variable: every flag --name reads TANDEM_NAME. FLAGS pass
#   through to the binary unchanged, and the command line wins over the environment.
# - TANDEM_ROLE and TANDEM_BIN_DIR are removed from the environment, and the binary replaces this
#   shell (exec): it keeps this process's id (PID 1 in a container) and receives SIGTERM itself.
#
# Exit status: 2 when the role is missing or unknown; 1 when the model or the binary is missing;
# otherwise the binary's. POSIX sh: runs under dash and busybox as well as bash.
set -eu

prog=tandem-entrypoint
# The model a folder must hold when no file is named: kDefaultModelFile in
# engine/model/model_path.h (tests/deploy/image_entrypoint_test.py keeps the two equal).
default_model_file=SmolLM2-135M-Instruct.Q4_1.gguf
roles="router, prefill or decode"

fail() {
  status=$1
  shift
  printf '%s: %s\n' "$prog" "$*" >&2
  exit "$status"
}

# The role: the first argument when it names one, else TANDEM_ROLE.
case "${1:-}" in
  router | prefill | decode)
    role=$1
    shift
    ;;
  "" | -*)
    role=${TANDEM_ROLE:-}
    [ -n "$role" ] ||
      fail 2 "no role: give $roles as the first argument or in TANDEM_ROLE"
    ;;
  *) fail 2 "unknown role '$1': the first argument must be $roles (or a flag, with TANDEM_ROLE set)" ;;
esac
case "$role" in
  router) binary=tandem-router ;;
  prefill) binary=tandem-prefill ;;
  decode) binary=tandem-decode ;;
  *) fail 2 "unknown role '$role' in TANDEM_ROLE: use $roles" ;;
esac

bin_dir=${TANDEM_BIN_DIR:-/opt/tandem/bin}
[ -x "$bin_dir/$binary" ] ||
  fail 1 "$bin_dir/$binary is missing or not executable (binaries are looked up in TANDEM_BIN_DIR, default /opt/tandem/bin)"

# The model, from the environment or, when given there, the command line (which the binary
# prefers too).
model=${TANDEM_MODEL:-}
model_from=TANDEM_MODEL
models_dir=${TANDEM_MODELS_DIR:-}
models_dir_from=TANDEM_MODELS_DIR
next=""
for arg in "$@"; do
  if [ "$next" = model ]; then
    model=$arg model_from=--model next=""
    continue
  elif [ "$next" = models_dir ]; then
    models_dir=$arg models_dir_from=--models_dir next=""
    continue
  fi
  case "$arg" in
    --) break ;;
    --model=* | -model=*) model=${arg#*=} model_from=--model ;;
    --models_dir=* | -models_dir=*) models_dir=${arg#*=} models_dir_from=--models_dir ;;
    --model | -model) next=model ;;
    --models_dir | -models_dir) next=models_dir ;;
  esac
done

if [ -n "$model" ]; then
  [ -e "$model" ] ||
    fail 1 "model file $model ($model_from) does not exist: mount the model volume, or point $model_from at a GGUF file in it"
  [ -f "$model" ] || fail 1 "model $model ($model_from) is not a regular file"
  [ -r "$model" ] || fail 1 "model file $model ($model_from) is not readable by uid $(id -u)"
else
  if [ -z "$models_dir" ]; then
    models_dir=/models
    models_dir_from="the default model folder"
    TANDEM_MODELS_DIR=/models
    export TANDEM_MODELS_DIR
  fi
  [ -d "$models_dir" ] ||
    fail 1 "model folder $models_dir ($models_dir_from) does not exist: mount the model volume at /models, or set TANDEM_MODELS_DIR to the folder that holds $default_model_file, or TANDEM_MODEL to a model file"
  { [ -r "$models_dir" ] && [ -x "$models_dir" ]; } ||
    fail 1 "model folder $models_dir ($models_dir_from) is not readable by uid $(id -u)"
  [ -f "$models_dir/$default_model_file" ] ||
    fail 1 "model folder $models_dir ($models_dir_from) has no $default_model_file: put the model in the volume, or set TANDEM_MODEL to the model file"
  [ -r "$models_dir/$default_model_file" ] ||
    fail 1 "model file $models_dir/$default_model_file is not readable by uid $(id -u)"
fi

# Listen addresses of the contract, where the environment does not set them (an empty value is
# kept: it turns that server off where the binary allows it).
case "$role" in
  router)
    [ -n "${TANDEM_HTTP_LISTEN+set}" ] || TANDEM_HTTP_LISTEN=0.0.0.0:8000
    [ -n "${TANDEM_LISTEN+set}" ] || TANDEM_LISTEN=0.0.0.0:7000
    export TANDEM_HTTP_LISTEN TANDEM_LISTEN
    ;;
  prefill | decode)
    [ -n "${TANDEM_LISTEN+set}" ] || TANDEM_LISTEN=0.0.0.0:7100
    [ -n "${TANDEM_METRICS_LISTEN+set}" ] || TANDEM_METRICS_LISTEN=0.0.0.0:9100
    export TANDEM_LISTEN TANDEM_METRICS_LISTEN
    ;;
esac

if [ -n "$model" ]; then
  printf '%s: starting %s with model %s\n' "$prog" "$binary" "$model" >&2
else
  printf '%s: starting %s with the model in %s\n' "$prog" "$binary" "$models_dir" >&2
fi
unset TANDEM_ROLE TANDEM_BIN_DIR
exec "$bin_dir/$binary" "$@"
