#!/usr/bin/env bash
# Build the project's environment in .venv/ at the repo root, from nothing; a second run takes seconds.
#
#   launch/bootstrap.sh          # idempotent; prints one line per step
#
# Steps: a Python 3.11 interpreter -> .venv -> `pip install -c launch/constraints.txt -e .[dev]` (setup.py states the
# supported ranges, launch/constraints.txt the exact versions measured) -> ORTModule's torch C++ extensions for what
# this machine has -> an ORTModule forward/backward with fallback disabled.
# On a machine with an NVIDIA driver (or anywhere with ORT_ZERO_CUDA=1) also: the CUDA 11 libraries ORT's CUDA
# provider needs, into .venv/ort_zero-cuda11/ (wheels cached there, 1.4 GB), and ORTModule's GPU allocator extension.
# The venv is stamped with a hash of setup.py and the constraints; the stamp is re-checked on every run, so a changed
# version re-installs. What pip and the compiler print goes to .venv/ort_zero-*.log, shown only when a step fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.ort_zero-installed"
CONSTRAINTS="$ROOT/launch/constraints.txt"
say() { echo "[bootstrap] $*" >&2; }
die() { echo "[bootstrap] ERROR: $*" >&2; exit 1; }
# A step is one line: what it does when it starts, how it ended when it ends.
begin() { printf '[bootstrap] %s ... ' "$*" >&2; }
end() { echo "$*" >&2; }
# Run a command with its output in a log file; on failure print that log, then return the command's status.
quietly() {
    local log="$1" status=0
    shift
    "$@" >"$log" 2>&1 || status=$?
    [ "$status" -eq 0 ] || { printf '\n[bootstrap] output of the failed step (%s):\n' "$log" >&2; cat "$log" >&2; }
    return "$status"
}

find_python() {
    local candidate
    for candidate in "${ORT_ZERO_PYTHON:-}" python3.11 python3; do
        [ -n "$candidate" ] || continue
        command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

pins_hash() { cat "$ROOT/setup.py" "$CONSTRAINTS" | sha256sum | cut -c1-16; }

if [ ! -x "$VENV/bin/python" ]; then
    PYTHON="$(find_python)" || die "Python 3.11 not found (tried \$ORT_ZERO_PYTHON, python3.11, python3).
  onnxruntime-training 1.19.2 ships wheels for CPython 3.8-3.11 only; install python3.11 (e.g. pyenv install 3.11)
  or point ORT_ZERO_PYTHON at one."
    say "creating $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV" || die "'$PYTHON -m venv' failed: install the venv module (Debian: apt-get install python3.11-venv)."
fi

if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$(pins_hash)" ]; then
    command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 || die "no C++ compiler: ORTModule's torch
  extensions are compiled on this machine. Install one (Debian: apt-get install g++)."
    # Measured: the installed stack is 6.7 GB; pip also holds the downloaded wheels (~3 GB) while it installs.
    need_gib=10
    for dir in "$VENV" "${TMPDIR:-/tmp}"; do
        free_kib="$(df -Pk "$dir" | awk 'NR==2 {print $4}')"
        [ "$free_kib" -ge $((need_gib * 1024 * 1024)) ] || die "only $((free_kib / 1024 / 1024)) GiB free on the disk of $dir;
  installing the stack needs ~$need_gib GiB there (6.7 GB installed with torch's CUDA wheels, plus pip's downloads).
  Free some space (or point TMPDIR at a larger disk) and run this again."
    done
    PIP_LOG="$VENV/ort_zero-pip.log"
    begin "installing launch/constraints.txt's stack (first time: several minutes, 6.7 GB with torch's CUDA wheels)"
    quietly "$PIP_LOG" "$VENV/bin/python" -m pip install --upgrade pip setuptools wheel \
        || die "pip cannot reach the package index: check network access to PyPI (or PIP_INDEX_URL)."
    quietly "$PIP_LOG" "$VENV/bin/python" -m pip install -c "$CONSTRAINTS" -e "$ROOT[dev]" \
        || die "pip install -c launch/constraints.txt -e .[dev] failed (pip's output above): a version may be unavailable for this platform."
    end "$("$VENV/bin/python" -c 'from importlib.metadata import version as v; print(", ".join(f"{n} {v(n)}" for n in ("torch", "transformers")))')"
    pins_hash > "$STAMP"
else
    say "stack already installed in $VENV"
fi

# GPU hosts: onnxruntime-training is a CUDA 11.8 build, torch a CUDA 12 one; `import ort_zero` preloads these.
if "$VENV/bin/python" -c 'import sys; from ort_zero.stack.cuda_libraries import wanted; sys.exit(0 if wanted() else 1)'; then
    begin "the CUDA 11 libraries ORT's CUDA provider needs (first time: a 1.4 GB download)"
    "$VENV/bin/python" -m ort_zero.stack.cuda_libraries check >/dev/null 2>&1 \
        || quietly "$VENV/ort_zero-cuda11.log" "$VENV/bin/python" -m ort_zero.stack.cuda_libraries install \
        || die "the CUDA 11 libraries for ORT's CUDA provider could not be installed (output above)."
    end "installed"
fi

# Builds only what is missing; the build is cached in ~/.cache/ort_zero keyed on torch/ORT versions.
EXTENSIONS_LOG="$VENV/ort_zero-extensions.log"
begin "ORTModule's torch C++ extensions (a first build takes a few minutes on 2 cores)"
quietly "$EXTENSIONS_LOG" "$VENV/bin/python" -m ort_zero.stack.extensions ensure \
    || die "ORTModule's torch C++ extensions could not be built (output above). Run '$VENV/bin/ort-zero doctor'."
if grep -q '^\[extensions\] building' "$EXTENSIONS_LOG"; then how="built (compiler output: $EXTENSIONS_LOG)"
elif grep -q 'restored from' "$EXTENSIONS_LOG"; then how="restored from ${ORT_ZERO_CACHE:-~/.cache/ort_zero}"
else how="up to date"; fi
end "$how: $(grep -E '^\[extensions\] ((cpu|cuda): .*\.so|ort_zero: )' "$EXTENSIONS_LOG" | sed -E 's/^\[extensions\] //; s/\.cpython[^,]*\.so//g' | paste -sd ';' -)"
SMOKED="$VENV/.ort_zero-smoke-passed"
if [ ! -f "$SMOKED" ] || [ "$(cat "$SMOKED")" != "$(pins_hash)" ]; then
    begin "ORTModule smoke test, fallback disabled"
    quietly "$VENV/ort_zero-smoke.log" "$VENV/bin/python" -m ort_zero.stack.extensions smoke \
        || die "ORTModule smoke test failed with fallback disabled. Run '$VENV/bin/ort-zero doctor'."
    end "$(grep -o 'passed in ONNX Runtime.*' "$VENV/ort_zero-smoke.log")"
    pins_hash > "$SMOKED"
fi
say "ready: $VENV"
