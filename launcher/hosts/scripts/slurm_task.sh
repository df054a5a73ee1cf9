#!/bin/bash
# One replicate of a launcher run, run by its Slurm array task: targets.slurm writes this file as
# task.sh into the run's folder, and its values, NUL-separated, as task.args beside it:
#   RUNTIME IMAGE NAME ENV_FILE SOURCE_KIND SOURCE FACTS N EXPORT... COMMAND...
# RUNTIME: docker or pyxis. IMAGE: the pinned image ID. NAME: the container's name. ENV_FILE: the
# secrets' NAME=VALUE file, removed when the task ends ("" for none). SOURCE_KIND: registry (SOURCE
# is the reference to pull by digest) or shared (SOURCE is the image archive on the shared
# filesystem). FACTS: the text of facts.sh, the node's fact sheet. N EXPORT...: the NAME=VALUE
# variables exported for srun (pyxis). COMMAND: the `docker run` or `srun` argv.
# It writes task.json (exit code, status, node, job) and the node's facts into the run's folder.
# One node of a run of several (started by nodes.sh through srun, LAUNCHER_NODE_HOSTS set to the job's
# nodes by name, comma-separated): its values are in task-node<K>.args, K the node's index in the job
# (SLURM_NODEID); each @NODE<J>@ in them becomes node J's name; it writes node-<K>.json instead of task.json.
set -u
RUN=${0%/*}
ARGS=()
RESULT=task.json FACTS_FILE=node-facts.txt ARGS_FILE=task.args
if [ -n "${LAUNCHER_NODE_HOSTS:-}" ]; then
  K=${SLURM_NODEID:-0}
  RESULT=node-$K.json ARGS_FILE=task-node$K.args
  [ "$K" -eq 0 ] || FACTS_FILE=node-facts-$K.txt
  IFS=, read -r -a NODE_HOSTS <<< "$LAUNCHER_NODE_HOSTS"
fi
while IFS= read -r -d '' ARG; do
  if [ -n "${LAUNCHER_NODE_HOSTS:-}" ]; then
    for J in "${!NODE_HOSTS[@]}"; do ARG=${ARG//@NODE$J@/${NODE_HOSTS[$J]}}; done
  fi
  ARGS+=("$ARG")
done < "$RUN/$ARGS_FILE"
RUNTIME=${ARGS[0]} IMAGE=${ARGS[1]} NAME=${ARGS[2]} ENV_FILE=${ARGS[3]}
SOURCE_KIND=${ARGS[4]} SOURCE=${ARGS[5]} FACTS=${ARGS[6]} N=${ARGS[7]}
EXPORTS=("${ARGS[@]:8:N}")
COMMAND=("${ARGS[@]:8+N}")

write_task() {
  printf '{"exit_code": %s, "status": "%s", "node": "%s", "job_id": "%s", "array_index": "%s", "partition": "%s", "image_ran": "%s", "error": "%s", "ended_at": "%s"}\n' \
    "$1" "$2" "${SLURMD_NODENAME:-$(hostname)}" "${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-}}" \
    "${SLURM_ARRAY_TASK_ID:-0}" "${SLURM_JOB_PARTITION:-}" "${HAVE:-}" "$3" \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$RUN/$RESULT.part" && mv -f "$RUN/$RESULT.part" "$RUN/$RESULT"
}

sh -c "$FACTS" > "$RUN/$FACTS_FILE" 2>/dev/null || true
if [ -n "$ENV_FILE" ]; then  # the secrets' file goes when the task ends, however it ends
  trap 'rm -f "$ENV_FILE"' EXIT
fi

if [ "$RUNTIME" = pyxis ]; then
  # enroot keeps no Docker image ID; the manifest digest it pulls by names exactly this image ID
  HAVE="$IMAGE"
  for E in ${EXPORTS[@]+"${EXPORTS[@]}"}; do export "${E?}"; done
  if [ -n "$ENV_FILE" ]; then  # NAME=VALUE lines, exported as they are
    while IFS= read -r LINE; do export "${LINE?}"; done < "$ENV_FILE"
  fi
  "${COMMAND[@]}" &
  STEP=$!
  # shellcheck disable=SC2317  # called by the trap
  cancelled() {
    kill -TERM "$STEP" 2>/dev/null; wait "$STEP" 2>/dev/null
    write_task 143 cancelled "cancelled by Slurm (scancel or time limit)"
    exit 143
  }
  trap cancelled TERM INT
  wait "$STEP"
  RC=$?
else
  # the image only when the node lacks that ID: a pull by digest, or a load of the shared archive;
  # what went wrong lands in $FETCHED (one line, no quotes or backslashes: it goes into JSON)
  fetch() {
    if [ "$SOURCE_KIND" = registry ]; then
      docker pull -q "$SOURCE"
    elif test -f "$SOURCE"; then
      docker load -q -i "$SOURCE" || echo no image archive "$SOURCE"
    else
      echo no image archive "$SOURCE"
    fi
  }
  HAVE=$(docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
  if [ -z "$HAVE" ]; then
    # shellcheck disable=SC1003  # tr deletes double quotes and backslashes
    FETCHED=$( (fetch) 2>&1 >/dev/null | tail -n 1 | tr -d '"\\')
    HAVE=$(docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
  fi
  if [ "$HAVE" != "$IMAGE" ]; then
    MSG="node ${SLURMD_NODENAME:-$(hostname)} does not have the pinned image $IMAGE (it has: ${HAVE:-none}${FETCHED:+; $FETCHED}); nothing was run"
    echo "launcher: $MSG" >&2
    write_task 125 failed "$MSG"
    exit 125
  fi
  docker rm -f "$NAME" >/dev/null 2>&1 || true
  # shellcheck disable=SC2317  # called by the trap
  cancelled() {
    docker stop -t 5 "$NAME" >/dev/null 2>&1
    write_task 143 cancelled "cancelled by Slurm (scancel or time limit)"
    exit 143
  }
  trap cancelled TERM INT
  "${COMMAND[@]}" &
  wait $!
  RC=$?
  docker rm "$NAME" >/dev/null 2>&1 || true
fi

if [ "$RC" -eq 0 ]; then write_task 0 succeeded ""; else write_task "$RC" failed "exit $RC"; fi
exit "$RC"
