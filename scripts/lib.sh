# Shared by scripts/serve and scripts/test: Debian packages and the project virtualenv.
# shellcheck shell=bash

# as_root CMD...: run CMD as root (directly when already root, else through sudo).
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# apt_ensure PKG...: install the Debian packages that are not installed yet.
apt_ensure() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo ">> installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

# ensure_venv EXTRAS: create .venv with python3 (3.11+) and install the project into it, only
# when needed: .venv is missing, or pyproject.toml changed since the last install (or these
# EXTRAS were never installed). The stamp .venv/.imds-installed holds one line per install,
# "SHA256-OF-PYPROJECT EXTRAS"; an install with extras also covers the plain one. So a second
# start needs no network (the project is installed editable: source edits need no reinstall).
ensure_venv() {
  local extras="$1" stamp=.venv/.imds-installed digest
  digest=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ -x .venv/bin/python ] && [ -f "$stamp" ] \
      && { [ -z "$extras" ] && grep -q "^$digest " "$stamp" || grep -qxF "$digest $extras" "$stamp"; }; then
    return 0
  fi
  if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    apt_ensure python3-venv
  fi
  if [ ! -x .venv/bin/python ]; then
    echo ">> creating .venv"
    python3 -m venv .venv
  fi
  echo ">> installing imds${extras} into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extras}"
  if [ -f "$stamp" ] && grep -q "^$digest " "$stamp"; then
    echo "$digest $extras" >> "$stamp"
  else
    echo "$digest $extras" > "$stamp"  # a new pyproject.toml: earlier installs no longer count
  fi
}
