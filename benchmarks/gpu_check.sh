#!/usr/bin/env bash
# benchmarks/gpu_check.py on a GPU machine WITHOUT network, from a checkout:
#   make gpu-wheels                     # here, with network: .gpuwheels/ (git-ignored)
#   bash benchmarks/gpu_check.sh [gpu_check.py options]     # there, with .gpuwheels/
# A venv that sees the machine's own packages (its CUDA torch above all) gets what the
# broker needs and the machine lacks from .gpuwheels/ (pip --no-index); marbled comes from
# the checkout (PYTHONPATH). What is set up is logged to $OUT/setup.log (OUT: where the
# results go; a temporary directory if unset). PYTHON: the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=${GPU_WHEELS:-.gpuwheels}
export OUT=${OUT:-$(mktemp -d -t gpu-check-XXXXXX)}
mkdir -p "$OUT"
VENV=$(mktemp -d -t gpu-check-venv-XXXXXX)
setup() {
    nvidia-smi -L 2>&1 || true
    local pip=("$VENV/bin/python" -m pip)
    if ! "$PYTHON" -m venv --system-site-packages "$VENV"; then  # no ensurepip there
        rm -rf "$VENV"
        "$PYTHON" -m venv --system-site-packages --without-pip "$VENV"
        pip=("$PYTHON" -m pip --python "$VENV/bin/python")
    fi
    # Where $PYTHON is itself a venv's (an image's torch venv), --system-site-packages shows
    # the base interpreter's packages, not that venv's: a .pth adds them after ours.
    "$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' \
        > "$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')/outer.pth"
    # import name -> distribution, for what the broker and the check import
    local missing
    missing=$("$VENV/bin/python" - <<'EOF'
import importlib.util
NEEDS = {"aiohttp": "aiohttp", "sqlalchemy": "SQLAlchemy>=2.0", "click": "click>=8.1",
         "yaml": "PyYAML", "prometheus_client": "prometheus_client", "rich": "rich",
         "pynvml": "nvidia-ml-py"}
print(" ".join(d for m, d in NEEDS.items() if importlib.util.find_spec(m) is None))
EOF
)
    echo "python: $("$VENV/bin/python" -V 2>&1); missing here: ${missing:-nothing}"
    if [ -n "$missing" ]; then
        # shellcheck disable=SC2086 # one word per distribution
        "${pip[@]}" install --no-index --find-links "$WHEELS" $missing || {
            echo "gpu_check.sh: cannot install $missing from $WHEELS/ (no network here):" \
                 "make gpu-wheels on a machine with network, with GPU_WHEELS_PACKAGES" \
                 "naming them, and carry $WHEELS/ along" >&2
            return 1
        }
    fi
    "$VENV/bin/python" -c 'import aiohttp, sqlalchemy, click, yaml, torch; print("torch", torch.__version__)'
}
setup 2>&1 | tee "$OUT/setup.log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# gpu_check.py keeps its own --timeout; this one only guards against a hang of the script
exec timeout 540 "$VENV/bin/python" benchmarks/gpu_check.py "$@"
