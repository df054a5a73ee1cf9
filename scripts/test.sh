#!/usr/bin/env bash
# The test suite, with the real components it needs (see scripts/setup.sh), or a tier of it:
#   bash scripts/test.sh                the whole suite (what .ci/run runs)
#   bash scripts/test.sh --fast         ruff, mypy, shellcheck and the fast tier: no root, Docker or training
#   bash scripts/test.sh --tier local   up to a tier: fast, local (no SSH test hosts), hosts (no Slurm), full
# Any other argument goes to pytest (a file, -k EXPR, -x ...). Ends with the time each step and each tier took.
set -euo pipefail
cd "$(dirname "$0")/.."

tier=full
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --fast) tier=fast ;;
    --tier) tier=${2:?--tier needs fast, local, hosts or full}; shift ;;
    --tier=*) tier=${1#--tier=} ;;
    *) args+=("$1") ;;
  esac
  shift
done

times=()
timed() {  # timed NAME COMMAND...: run it, keep its wall time for the summary
  local name=$1 start rc=0
  shift
  start=$(date +%s%N)
  "$@" || rc=$?
  times+=("$name $((($(date +%s%N) - start) / 1000000))")
  return $rc
}

if [ "$tier" = fast ]; then timed setup bash scripts/setup.sh --fast; else timed setup bash scripts/setup.sh; fi
timed ruff .venv/bin/ruff check launcher tests benchmarks
timed mypy .venv/bin/mypy
# the scripts launcher sends to hosts (launcher/hosts/scripts, launcher/vms)
timed shellcheck find launcher -name '*.sh' -exec shellcheck {} +

# the fast tier on two workers (pytest-xdist): its tests share nothing but the CPU; the other tiers share
# one Docker engine, its images and the test hosts, and run in one process
workers=()
[ "$tier" = fast ] && workers=(-n 2)
report=$(mktemp)
rc=0
LAUNCHER_TIER_REPORT=$report timed pytest .venv/bin/pytest --durations=15 --tier "$tier" "${workers[@]}" "${args[@]}" || rc=$?
echo "scripts/test.sh --tier $tier: wall time of each step"
total=0
for entry in "${times[@]}"; do
  ms=${entry#* }
  total=$((total + ms))
  printf '  %-11s %6d.%d s\n' "${entry% *}" $((ms / 1000)) $((ms % 1000 / 100))
done
printf '  %-11s %6d.%d s\n' total $((total / 1000)) $((total % 1000 / 100))
if [ -s "$report" ]; then  # written by tests/tiers.py: each tier's tests and their setup + call + teardown
  .venv/bin/python - "$report" <<'EOF'
import json
import sys

for tier, took in json.load(open(sys.argv[1])).items():
    if took["tests"]:
        print(f"  tier {tier:8s} {took['tests']:5d} tests {took['seconds']:8.1f} s (their setup, call and teardown)")
EOF
fi
rm -f "$report"
exit $rc
