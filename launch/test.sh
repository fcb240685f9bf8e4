#!/usr/bin/env bash
# The project's test command (README): build or check the environment, then run pytest from the repo root.
#
#   launch/test.sh                      # every test
#   launch/test.sh -m unit              # pytest arguments pass through
#
# Exits with pytest's code, except that "no tests collected" (5) is a failure too: a test command that finds
# nothing to run must not pass.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/launch/bootstrap.sh"
cd "$ROOT"
status=0
"$ROOT/.venv/bin/python" -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "[test] ERROR: pytest collected no tests" >&2
    exit 1
fi
exit "$status"
