#!/usr/bin/env bash
# Real chat templates to test the Jinja engine against (tests/tokenizer/jinja_reference_test.py):
# the *.jinja files that llama.cpp keeps in models/templates/ (Llama 3.x, Qwen2.5/3, Gemma, Phi-3.5,
# Mistral, Hermes, DeepSeek, ... as their model cards ship them), taken out of the PyPI sdist of
# llama-cpp-python pinned in scripts/requirements-reference.txt, verified by SHA-256, into
#
#   ~/.cache/tandem/chat-templates/llama.cpp-<version>/   (TANDEM_CHAT_TEMPLATES_DIR overrides)
#
# They are test data read at test time, never part of the build. Called by scripts/setup.sh;
# quick when the folder is there. A copy of the sdist already on this machine (bench/
# build_llama_cpp.sh keeps one) is used instead of downloading it again.
set -euo pipefail

VERSION="0.3.36"
SDIST="llama_cpp_python-$VERSION.tar.gz"
SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# PyPI's address of the file; the digest above is what is trusted, not the address.
URL="https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/$SDIST"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/tandem"
DEST="${TANDEM_CHAT_TEMPLATES_DIR:-$CACHE/chat-templates/llama.cpp-$VERSION}"
STAMP="$DEST/.tandem-sdist.sha256"

say() { printf '[chat-templates] %s\n' "$*"; }
die() {
  printf '[chat-templates] FAILED: %s\n' "$1" >&2
  shift
  for line in "$@"; do printf '[chat-templates]   %s\n' "$line" >&2; done
  exit 1
}

if [ "$(cat "$STAMP" 2>/dev/null)" = "$SHA256" ]; then
  say "llama.cpp $VERSION's templates: $DEST is up to date"
  exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/tandem-templates.XXXXXX")"
trap 'rm -rf "$work"' EXIT
if [ -f "$CACHE/llama.cpp/$VERSION/$SDIST" ]; then
  cp "$CACHE/llama.cpp/$VERSION/$SDIST" "$work/$SDIST"
else
  say "downloading $SDIST from PyPI (77 MB) for llama.cpp's chat templates"
  python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
    "$URL" "$work/$SDIST" || die "could not download $URL" \
    "check that PyPI (files.pythonhosted.org) is reachable"
fi
got="$(sha256sum "$work/$SDIST" | cut -d' ' -f1)"
[ "$got" = "$SHA256" ] || die "SHA-256 mismatch for $SDIST: got $got, expected $SHA256" \
  "the download is corrupt or not the pinned release"

prefix="llama_cpp_python-$VERSION/vendor/llama.cpp/models/templates"
tar -xzf "$work/$SDIST" -C "$work" --wildcards "$prefix/*.jinja"
count="$(find "$work/$prefix" -name '*.jinja' | wc -l)"
[ "$count" -gt 0 ] || die "no templates under $prefix in $SDIST"
mkdir -p "$DEST"
rm -f "$DEST"/*.jinja
cp "$work/$prefix"/*.jinja "$DEST/"
printf '%s\n' "$SHA256" >"$STAMP"
say "$count templates in $DEST"
