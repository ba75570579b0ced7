#!/usr/bin/env bash
# Install the Debian packages a test tier needs, if missing: tests/debian-packages.sh PKG...
# Needs root (CI and these machines run as root); prints what it installs. Exit 0 when all
# are there, 1 with a reason on stderr when they cannot be installed here.
set -euo pipefail
missing=""
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "not root: cannot install$missing (apt-get install$missing as root)" >&2
  exit 1
fi
echo "installing Debian packages:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
