# Sourced by the scripts that make the opt-in virtual environments (setup_lmeval.sh,
# setup_torch.sh): their messages, the up-to-date check and the environment's creation.
# Before sourcing, set TAG (the messages' prefix), VENV and REQUIREMENTS (the pinned file).
#
# Sourcing it defines say, die, optin_venv_create and optin_venv_done, and exits the script with
# 0 when $VENV was made from this very $REQUIREMENTS (a sha256 stamp inside it).

say() { printf '[%s] %s\n' "$TAG" "$*"; }
die() {
  printf '[%s] FAILED: %s\n' "$TAG" "$1" >&2
  shift
  for line in "$@"; do printf '[%s]   %s\n' "$TAG" "$line" >&2; done
  exit 1
}

optin_stamp="$VENV/.tandem-requirements.sha256"
optin_want="$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$optin_stamp" 2>/dev/null)" = "$optin_want" ]; then
  say "$VENV is up to date"
  exit 0
fi
optin_python="${TANDEM_SETUP_PYTHON:-/usr/bin/python3}"
[ -x "$optin_python" ] || die "$optin_python not found" \
  "install the Debian packages python3 and python3-venv"

# Creates $VENV (over Debian's python3, TANDEM_SETUP_PYTHON) unless it exists.
optin_venv_create() {
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV with $optin_python"
    "$optin_python" -m venv "$VENV" || die "could not create the virtual environment $VENV" \
      "install the Debian package python3-venv"
  fi
}

# Marks $VENV as made from this $REQUIREMENTS; `$1` is the closing message.
optin_venv_done() {
  printf '%s\n' "$optin_want" >"$optin_stamp"
  say "$1"
}
