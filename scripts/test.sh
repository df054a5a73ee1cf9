#!/usr/bin/env bash
# The whole test suite, with the real components it needs (see scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check launcher tests benchmarks
.venv/bin/mypy
# the scripts launcher sends to hosts (launcher/hosts/scripts, launcher/vms)
find launcher -name '*.sh' -exec shellcheck {} +
exec .venv/bin/pytest --durations=15 "$@"
