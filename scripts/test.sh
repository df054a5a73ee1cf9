#!/usr/bin/env bash
# The test suite, with the real components it needs (see scripts/setup.sh), or a tier of it:
#   bash scripts/test.sh                the whole suite (what .ci/run runs)
#   bash scripts/test.sh --fast         ruff, mypy, shellcheck and the fast tier: no root, Docker or training
#   bash scripts/test.sh --tier local   up to a tier: fast, local (no SSH test hosts), hosts (no Slurm), full
#   bash scripts/test.sh --serial       in one pytest process (the default is two workers, see below)
# Any other argument goes to pytest (a file, -k EXPR, -x ...). Ends with the time each step and each tier took.
set -euo pipefail
cd "$(dirname "$0")/.."

tier=full
serial=0
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --fast) tier=fast ;;
    --serial) serial=1 ;;
    --tier) tier=${2:?--tier needs fast, local, hosts or full}; shift ;;
    --tier=*) tier=${1#--tier=} ;;
    *) args+=("$1") ;;
  esac
  shift
done

began=$(date +%s%N)
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

# The fast tier on two workers (pytest-xdist): its tests share nothing but the CPU. Then the other tiers in
# two lanes side by side, two pytest processes sharing the Docker engine and its images (tests/tiers.py):
# lane "local" prints as it goes, lane "hosts" (test hosts, cluster) into a file printed when it ends.
# With --serial, or a selection of tests given, one pytest process runs everything in order.
reports=()
rc=0
lanes=
pytest_step() {  # pytest_step NAME ARGS...: one pytest run, its tier report kept for the summary
  local name=$1 report
  shift
  report=$(mktemp)
  reports+=("$report")
  LAUNCHER_TIER_REPORT=$report timed "$name" .venv/bin/pytest "$@"
}
if [ "$tier" = fast ] || [ "$serial" = 1 ] || [ ${#args[@]} -gt 0 ]; then
  workers=()
  [ "$tier" = fast ] && [ "$serial" = 0 ] && workers=(-n 2)
  pytest_step pytest --durations=15 --tier "$tier" "${workers[@]}" "${args[@]}" || rc=$?
else
  lanes=1
  pytest_step fast --durations=5 --tier fast -n 2 || rc=$?
  hosts_log=$(mktemp)
  hosts_report=$(mktemp)
  hosts_ms=$(mktemp)
  reports+=("$hosts_report")
  # (a lane with no test, as lane hosts up to --tier local may be, ends with pytest's 5: not a failure)
  (
    start=$(date +%s%N)
    lane_rc=0
    LAUNCHER_TIER_REPORT=$hosts_report .venv/bin/pytest --durations=15 --tier "$tier" --lane hosts \
      -p no:cacheprovider >"$hosts_log" 2>&1 || lane_rc=$?
    echo $((($(date +%s%N) - start) / 1000000)) >"$hosts_ms"
    [ $lane_rc = 0 ] || [ $lane_rc = 5 ]
  ) &
  hosts_pid=$!
  pytest_step lane-local --durations=15 --tier "$tier" --lane local || [ $? = 5 ] || rc=1
  wait "$hosts_pid" || rc=1
  times+=("lane-hosts $(cat "$hosts_ms")")
  echo "=== lane hosts (ran beside lane local) ==="
  cat "$hosts_log"
  rm -f "$hosts_ms"
  rm -f "$hosts_log"
fi
echo "scripts/test.sh --tier $tier: wall time of each step${lanes:+ (lane-local and lane-hosts side by side)}"
for entry in "${times[@]}"; do
  ms=${entry#* }
  printf '  %-11s %6d.%d s\n' "${entry% *}" $((ms / 1000)) $((ms % 1000 / 100))
done
total=$((($(date +%s%N) - began) / 1000000))
printf '  %-11s %6d.%d s\n' total $((total / 1000)) $((total % 1000 / 100))
# each tier's tests, summed over the pytest runs (written by tests/tiers.py)
.venv/bin/python - "${reports[@]}" <<'EOF'
import json
import sys

tiers: dict = {}
for path in sys.argv[1:]:
    try:
        report = json.load(open(path))
    except (OSError, ValueError):
        continue
    for tier, took in report.items():
        sums = tiers.setdefault(tier, {"tests": 0, "seconds": 0.0})
        sums["tests"] += took["tests"]
        sums["seconds"] += took["seconds"]
for tier, took in tiers.items():
    if took["tests"]:
        print(f"  tier {tier:8s} {took['tests']:5d} tests {took['seconds']:8.1f} s (their setup, call and teardown)")
EOF
rm -f "${reports[@]}"
exit $rc
