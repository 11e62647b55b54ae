# Sourced by scripts/test: Debian's Ganeti 3.0 for the side-by-side metad tests
# (tests/ganeti_metad.py). The packages are downloaded and unpacked, never installed:
# no postinst runs and no Ganeti daemon starts on this machine.
# shellcheck shell=bash

GANETI_CACHE=.cache/ganeti  # .gitignored; tests/ganeti_metad.py reads $GANETI_CACHE/root

# ganeti_unpack: ganeti-haskell-3.0 (ganeti-metad) and ganeti-3.0 (ganeti.metad.Client) into
# $GANETI_CACHE/root, unless already there.
ganeti_unpack() {
  local root="$GANETI_CACHE/root"
  if [ -x "$root/usr/lib/ganeti/3.0/usr/sbin/ganeti-metad" ] && [ -f "$root/usr/share/ganeti/3.0/ganeti/metad.py" ]; then
    return 0
  fi
  echo ">> downloading Ganeti's Debian packages into $GANETI_CACHE (unpacked, not installed)"
  rm -rf "$GANETI_CACHE" && mkdir -p "$GANETI_CACHE/debs"
  (cd "$GANETI_CACHE/debs" && apt-get download ganeti-haskell-3.0 ganeti-3.0) \
    || { as_root apt-get update -qq && (cd "$GANETI_CACHE/debs" && apt-get download ganeti-haskell-3.0 ganeti-3.0); }
  for deb in "$GANETI_CACHE"/debs/*.deb; do dpkg -x "$deb" "$root"; done
}

# ganeti_users: the system users and groups ganeti-metad looks up when it starts (without them it
# stops with "Can't determine user/group ids: getUserEntryForName: does not exist").
ganeti_users() {
  local group user
  for group in gnt-daemons gnt-admin gnt-masterd gnt-metad gnt-rapi gnt-confd gnt-luxid; do
    getent group "$group" >/dev/null || as_root groupadd --system "$group"
  done
  for user in gnt-masterd gnt-metad gnt-rapi gnt-confd; do
    getent passwd "$user" >/dev/null \
      || as_root useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin -g "$user" "$user"
  done
}
