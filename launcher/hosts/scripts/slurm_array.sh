#!/bin/bash
# A launcher job array, as sbatch runs it on a Slurm node: targets.slurm writes this file as
# array.sh into the array's folder and submits it with its sbatch options on the command line:
#   sbatch --array=0-N ... array.sh ARRAY_DIR
# ARRAY_DIR holds `tasks`, the task script of each array index in order, NUL-separated (the
# run's task.sh, hosts/scripts/slurm_task.sh). Task i runs the i-th of them.
set -u
ARRAY_DIR=${1:?usage: array.sh ARRAY_DIR}
TASKS=()
while IFS= read -r -d '' TASK; do TASKS+=("$TASK"); done < "$ARRAY_DIR/tasks"
INDEX=${SLURM_ARRAY_TASK_ID:-0}
if [ "$INDEX" -ge "${#TASKS[@]}" ]; then
  echo "launcher: array task $INDEX has no task script in $ARRAY_DIR/tasks" >&2
  exit 2
fi
exec bash "${TASKS[$INDEX]}"
