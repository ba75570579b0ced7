#!/usr/bin/env bash
# The venv's packages, what `make venv` runs: install.sh VENV_BIN REQUIREMENT...
#
# uv (PyPI) installs them in a third of pip's time: it unpacks TensorFlow and torch in
# parallel (22 s against 72 s on 2 cores, cold caches), and the CI starts bare each time.
# uv reads no pip.conf, so pip's own index settings (its config files and PIP_* variables)
# are handed on; pip's rule of taking the best version over all indexes too. Where uv
# cannot be had (no route to PyPI) or fails, pip installs everything, as it always did.
set -euo pipefail
bin=$1
shift

# 'compat': the project's directory on sys.path (a .pth line) rather than setuptools'
# import hook, whose own imports cost every Python process 30-60 ms (the tests start
# thousands)
with_uv() {
    "$bin/pip" install --quiet --timeout 15 --retries 1 uv || return 1
    local args=() value
    setting() { "$bin/pip" config list 2>/dev/null | sed -n "s/^[^.]*\.$1='\(.*\)'\$/\1/p" | head -n 1; }
    for value in $(setting index-url); do args+=(--index-url "$value"); done
    for value in $(setting extra-index-url); do args+=(--extra-index-url "$value"); done
    for value in $(setting find-links); do args+=(--find-links "$value"); done
    for value in $(setting constraint); do args+=(--constraint "$value"); done
    # --no-cache: the unpacked wheels would stay behind in ~/.cache (2.5 GB) for no second use
    "$bin/uv" pip install --quiet --no-cache --python "$bin/python" \
        --index-strategy unsafe-best-match "${args[@]}" \
        --compile-bytecode --config-setting editable_mode=compat --upgrade-package pip pip "$@"
}

with_pip() {
    "$bin/pip" install --quiet --upgrade pip
    # where a setuptools no longer has the 'compat' mode, the default install
    "$bin/pip" install --quiet "$@" --config-settings editable_mode=compat \
        || "$bin/pip" install --quiet "$@"
}

with_uv "$@" || { echo "install.sh: uv could not install; pip does" >&2; with_pip "$@"; }
