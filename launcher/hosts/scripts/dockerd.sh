# shellcheck shell=sh
# Runs on a host without systemd (a container, WSL, an init without units), as root, sent as text
# in provision's install plan (hosts/provision.start_docker): sh -c TEXT sh ACTION LOG WAIT_S.
#   stop:  stop dockerd by its pid file, waiting at most WAIT_S s for it to end
#   start: start dockerd in its own session in the background, logging to LOG, unless Docker answers
#   wait:  wait at most WAIT_S s until `docker info` answers (else say how LOG ends)
action=$1 log=$2 wait_s=$3
case "$action" in
  stop)
    # dockerd removes its pid file as it ends; a stale file (no such process) needs no stop
    pid=$(cat /var/run/docker.pid 2>/dev/null) || exit 0
    kill "$pid" 2>/dev/null || exit 0
    i=0
    while [ -e /var/run/docker.pid ] && kill -0 "$pid" 2>/dev/null; do
      i=$((i+1))
      if [ "$i" -ge "$wait_s" ]; then echo "dockerd ($pid) did not stop within $wait_s s" >&2; exit 1; fi
      sleep 1
    done
    ;;
  start)
    if ! docker info >/dev/null 2>&1; then setsid dockerd >"$log" 2>&1 </dev/null & fi
    ;;
  wait)
    i=0
    until docker info >/dev/null 2>&1; do
      i=$((i+1))
      if [ "$i" -ge "$wait_s" ]; then
        echo "Docker did not answer within $wait_s s; $log ends: $(tail -n 1 "$log" 2>&1)" >&2
        exit 1
      fi
      sleep 1
    done
    ;;
  *)
    echo "dockerd.sh: unknown action $action" >&2
    exit 2
    ;;
esac
