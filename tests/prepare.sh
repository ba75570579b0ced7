#!/usr/bin/env bash
# prepare.sh PYTHON TARGET - what the test tiers need besides the venv, made while pip fills
# the venv (`make test` starts it in the background first: pip works on one core, and this
# is most of a minute of the other): the Debian packages (Slurm's daemons, as cluster.sh
# installs them; libslurm-dev; chromium for the dashboard; tmux for `marble watch`; sqlite3,
# the tool a damaged store is recovered with) and
# pyslurm, built with PYTHON (the interpreter the venv is made from) into TARGET
# (tests/slurm/pyslurm.sh). Each step is idempotent and takes the lock its tier takes, so a
# test that needs one meanwhile waits for it; a step that cannot run here (not root) says
# why in the log, and its tier says it again.
set -u
here=$(cd "$(dirname "$0")" && pwd)
python=${1:?usage: prepare.sh PYTHON TARGET}
target=${2:?usage: prepare.sh PYTHON TARGET}
start=$SECONDS
bash "$here/slurm/cluster.sh" install || echo "prepare: Slurm's packages not installed" >&2
bash "$here/debian-packages.sh" libslurm-dev chromium chromium-driver tmux sqlite3 \
  || echo "prepare: Debian packages not installed" >&2
PYTHON=$python bash "$here/slurm/pyslurm.sh" "$target" || echo "prepare: no pyslurm" >&2
echo "prepare: $((SECONDS - start)) s"
