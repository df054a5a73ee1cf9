#!/bin/bash
# A launcher run of several nodes, run by its Slurm job (an array task of N nodes, one task per node):
# targets.slurm writes this file as nodes.sh into the run's folder, beside task.sh (slurm_task.sh) and
# each node's values (task-node<K>.args). It starts one task.sh on every node of the job through srun,
# the job's node names given to each (LAUNCHER_NODE_HOSTS, node 0's first: the rendezvous), and writes
# task.json once they have ended: the exit code of the first node that failed, else 0.
# The first node to fail stops the others: every node's step gets SIGTERM (task.sh stops its container),
# so no rank waits in a collective for one that died. scancel stops them all the same way.
set -u
RUN=${0%/*}
mapfile -t HOSTS < <(scontrol show hostnames "${SLURM_JOB_NODELIST:?}")
LAUNCHER_NODE_HOSTS=$(IFS=,; echo "${HOSTS[*]}")
export LAUNCHER_NODE_HOSTS
N=${#HOSTS[@]}
rm -f "$RUN"/node-*.json
srun --nodes="$N" --ntasks="$N" --ntasks-per-node=1 --kill-on-bad-exit=0 bash "$RUN/task.sh" &
STEP=$!

# shellcheck disable=SC2317  # called by the trap
stop_nodes() {
  scancel --signal=TERM "${SLURM_JOB_ID}.0" 2>/dev/null || kill -TERM "$STEP" 2>/dev/null
}
CANCELLED=""
trap 'CANCELLED=1; stop_nodes; wait "$STEP"' TERM INT

first_failed() {  # the result file of a node that failed on its own (not one stopped: 143), else of any that failed
  local F
  for F in "$RUN"/node-*.json; do
    if grep -q '"exit_code": [1-9]' "$F" 2>/dev/null && ! grep -q '"exit_code": 143,' "$F"; then
      echo "$F"
      return
    fi
  done
  grep -l '"exit_code": [1-9]' "$RUN"/node-*.json 2>/dev/null | head -n 1
}
FIRST=""
while kill -0 "$STEP" 2>/dev/null; do
  if [ -z "$FIRST" ]; then
    FIRST=$(first_failed)
    if [ -n "$FIRST" ]; then stop_nodes; fi
  fi
  sleep 1
done
wait "$STEP"
RC=$?
if [ -z "$FIRST" ]; then FIRST=$(first_failed); fi
CODE=0 STATUS=succeeded ERROR="" NODE=""
if [ -n "$CANCELLED" ] && { [ -z "$FIRST" ] || grep -q '"exit_code": 143,' "$FIRST"; }; then
  CODE=143 STATUS=cancelled ERROR="cancelled by Slurm (scancel or time limit)"
elif [ -n "$FIRST" ]; then
  CODE=$(sed -n 's/.*"exit_code": \([0-9]*\).*/\1/p' "$FIRST")
  NODE=${FIRST##*/node-}
  NODE=${NODE%.json}
  STATUS=failed ERROR="node $NODE failed (exit $CODE)"
elif [ "$RC" -ne 0 ]; then
  CODE=$RC STATUS=failed ERROR="srun ended with exit $RC"
fi
IMAGE_RAN=$(sed -n 's/.*"image_ran": "\([^"]*\)".*/\1/p' "$RUN/node-0.json" 2>/dev/null)
printf '{"exit_code": %s, "status": "%s", "node": "%s", "job_id": "%s", "array_index": "%s", "partition": "%s", "image_ran": "%s", "error": "%s", "ended_at": "%s", "nodes": "%s"}\n' \
  "$CODE" "$STATUS" "${HOSTS[0]}" "${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-}}" "${SLURM_ARRAY_TASK_ID:-0}" \
  "${SLURM_JOB_PARTITION:-}" "$IMAGE_RAN" "$ERROR" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$LAUNCHER_NODE_HOSTS" \
  > "$RUN/task.json.part" && mv -f "$RUN/task.json.part" "$RUN/task.json"
exit "$CODE"
