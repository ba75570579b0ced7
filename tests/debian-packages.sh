#!/usr/bin/env bash
# Install the Debian packages a test tier needs, if missing: tests/debian-packages.sh PKG...
# Needs root (CI and these machines run as root); prints what it installs. Exit 0 when all
# are there, 1 with a reason on stderr when they cannot be installed here.
set -euo pipefail
missing() {
  local p out=""
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || out="$out $p"
  done
  echo "$out"
}
[ -z "$(missing "$@")" ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "not root: cannot install$(missing "$@") (apt-get install$(missing "$@") as root)" >&2
  exit 1
fi
# one apt at a time: test workers (and cluster.sh) may ask at once, and apt-get fails at
# once on a lock another holds; whoever waited may find the packages there
exec 8>/var/lock/marbled-apt.lock
flock 8
todo=$(missing "$@")
[ -z "$todo" ] && exit 0
echo "installing Debian packages:$todo" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $todo >/dev/null
