#!/usr/bin/env bash
# Builds xgrammar's C++ core (grammar-constrained decoding: JSON Schema, regex and EBNF grammars
# compiled against a vocabulary into per-step token masks) as a static library, once, from the
# PyPI source distribution pinned in scripts/xgrammar.sha256, and installs it (headers, libxgrammar.a)
# into a cache that CMake finds (cmake/TandemDependencies.cmake):
#
#   ${XDG_CACHE_HOME:-~/.cache}/tandem/xgrammar/<version>/{include,lib}
#
# Why from source: the PyPI wheel holds only a Python extension (no headers, no C++ library), and
# Debian has no package. The sdist has the core (C++17, its own CMake, vendored picojson and
# dlpack headers). Built without its Python bindings, without LTO (a static archive of GCC LTO
# objects would tie our link to the archiver's plugin), and without -Werror (its warnings are not
# ours to fix). A few minutes on 2 cores; a second run with the library present does nothing.
#
# Called by scripts/setup.sh and by the Docker images' build stage. Needs curl (or python3), a C++
# compiler, CMake and Ninja. Environment: TANDEM_XGRAMMAR_PREFIX (install here instead),
# TANDEM_XGRAMMAR_SDIST (a local copy of the sdist instead of downloading; still verified).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUMS="$ROOT/scripts/xgrammar.sha256"
SHA256="$(awk 'NR==1 {print $1}' "$SUMS")"
SDIST="$(awk 'NR==1 {print $2}' "$SUMS")"
VERSION="${SDIST#xgrammar-}"
VERSION="${VERSION%.tar.gz}"
# PyPI's address of the file; the digest above is what is trusted, not the address.
URL="https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/$SDIST"
PREFIX="${TANDEM_XGRAMMAR_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/xgrammar/$VERSION}"
STAMP="$PREFIX/.tandem-sdist.sha256"

say() { printf '[xgrammar] %s\n' "$*"; }
die() {
  printf '[xgrammar] FAILED: %s\n' "$1" >&2
  shift
  for line in "$@"; do printf '[xgrammar]   %s\n' "$line" >&2; done
  exit 1
}

if [ -f "$PREFIX/lib/libxgrammar.a" ] && [ -f "$PREFIX/include/xgrammar/xgrammar.h" ] &&
  [ "$(cat "$STAMP" 2>/dev/null)" = "$SHA256" ]; then
  say "xgrammar $VERSION: $PREFIX is up to date"
  exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/tandem-xgrammar.XXXXXX")"
trap 'rm -rf "$work"' EXIT
if [ -n "${TANDEM_XGRAMMAR_SDIST:-}" ]; then
  cp "$TANDEM_XGRAMMAR_SDIST" "$work/$SDIST"
else
  say "xgrammar $VERSION: downloading $SDIST from PyPI"
  if command -v curl >/dev/null 2>&1; then
    curl -fsSL --retry 3 -o "$work/$SDIST" "$URL" || die "could not download $URL" \
      "check that PyPI (files.pythonhosted.org) is reachable, or set TANDEM_XGRAMMAR_SDIST"
  else
    python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
      "$URL" "$work/$SDIST" || die "could not download $URL" \
      "check that PyPI (files.pythonhosted.org) is reachable, or set TANDEM_XGRAMMAR_SDIST"
  fi
fi
got="$(sha256sum "$work/$SDIST" | cut -d' ' -f1)"
[ "$got" = "$SHA256" ] || die "SHA-256 mismatch for $SDIST: got $got, expected $SHA256" \
  "the download is corrupt or not the pinned release; the expected digest is in scripts/xgrammar.sha256"

tar -xzf "$work/$SDIST" -C "$work"
src="$work/xgrammar-$VERSION"
mkdir -p "$work/build"
# xgrammar's cmake/config.cmake turns the Python bindings on with set(); a config.cmake in the
# build folder takes precedence over it.
cat >"$work/build/config.cmake" <<'CFG'
set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)
set(XGRAMMAR_BUILD_CXX_TESTS OFF)
set(XGRAMMAR_ENABLE_CPPTRACE OFF)
set(XGRAMMAR_ENABLE_COVERAGE OFF)
set(XGRAMMAR_ENABLE_INTERNAL_CHECK OFF)
CFG
launcher=()
if command -v ccache >/dev/null 2>&1; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
say "xgrammar $VERSION: compiling the C++ core (a few minutes), into $PREFIX"
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS="-fno-lto -Wno-error" -DCMAKE_INSTALL_PREFIX="$PREFIX" \
  -DCMAKE_INSTALL_LIBDIR=lib "${launcher[@]}" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; die "xgrammar's CMake configure failed (its output is above)"; }
cmake --build "$work/build" --target xgrammar ||
  die "xgrammar did not compile" "see the compiler's message above; GCC 12 (Debian 12) builds it"
rm -rf "$PREFIX"
cmake --install "$work/build" >/dev/null || die "could not install xgrammar into $PREFIX"
printf '%s\n' "$SHA256" >"$STAMP"
say "xgrammar $VERSION: $PREFIX (SHA-256 of the sdist verified)"
