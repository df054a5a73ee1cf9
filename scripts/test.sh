#!/usr/bin/env bash
# The whole test suite, with the real components it needs (see scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check launcher tests benchmarks
.venv/bin/mypy
exec .venv/bin/pytest --durations=15 "$@"
