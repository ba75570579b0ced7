#!/usr/bin/env bash
# pyslurm.sh TARGET - build pyslurm for the Slurm tier once, from ../shared/vendor/ (relative to
# the checkout), into TARGET/lib (a directory for PYTHONPATH: the test venv itself stays without
# pyslurm, so the CLI path is tested as a site without it has it). No-op when TARGET holds a build
# of the same archive. Steps as ../shared/vendor/README.md gives them: libslurm-dev, Cython < 3,
# --no-build-isolation. Prints the seconds it took; exit 1 with the reason on stderr on failure.
# MARBLE_PYSLURM_SRC names another source archive; PYTHON the interpreter to build for (the
# venv's, or the python3 it is made from: one ABI; that one need not have pip).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=${1:?usage: pyslurm.sh TARGET}
src=${MARBLE_PYSLURM_SRC:-$repo/../shared/vendor/pyslurm-22.5.3.tar.gz}
python=${PYTHON:-python3}
[ -f "$src" ] || { echo "no pyslurm source archive at $src" >&2; exit 1; }
stamp="$target/built-from"
sum=$(sha256sum "$src" | cut -d' ' -f1)
[ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ] && exit 0
# one build at a time: `make test` starts it in the background and the Slurm tier waits here
mkdir -p "$(dirname "$target")"
exec 9>"$target.lock"
flock 9
[ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ] && exit 0
start=$SECONDS
rm -rf "$target"; mkdir -p "$target"
bash "$repo/tests/debian-packages.sh" libslurm-dev >&2   # slurm.h and libslurm.so
# build tools in their own venv: 22.5.x predates Cython 3
"$python" -m venv "$target/build-env"
"$target/build-env/bin/pip" install --quiet 'cython<3' wheel setuptools >&2
# unoptimised: the tests make a few hundred calls into it, and Python's own -O3 -g costs
# 430 s of CPU on 2 cores (pyslurm.c is one huge file), against 57 s at -O0, beside the tests
SLURM_LIB_DIR=/usr/lib/$(gcc -dumpmachine) SLURM_INCLUDE_DIR=/usr/include CFLAGS="-O0 -g0" \
  "$target/build-env/bin/pip" wheel --quiet --no-deps --no-build-isolation \
  --wheel-dir "$target/wheel" "$src" >&2
"$target/build-env/bin/pip" install --quiet --no-deps --target "$target/lib" "$target"/wheel/pyslurm-*.whl >&2
rm -rf "$target/build-env"
PYTHONPATH="$target/lib" "$python" -c 'import pyslurm; pyslurm.version()' >&2
echo "$sum" > "$stamp"
echo "$((SECONDS - start))"
