# shellcheck shell=sh
# Runs on one Slurm compute node (srun ... sh -c TEXT sh [HOST PORT]), sent as text by
# targets.cluster.cluster_facts: its Docker engine and runtimes, whether enroot is there and, given a
# registry's HOST and PORT, whether the node reaches it. One key=value per line.
docker info --format 'docker={{.ServerVersion}} runtimes={{range $k, $v := .Runtimes}}{{$k}},{{end}}' 2>/dev/null \
  || echo docker=
if command -v enroot >/dev/null; then echo enroot=1; else echo enroot=0; fi
if [ $# -ge 2 ]; then
  # shellcheck disable=SC2016  # expanded by the inner bash, from its arguments
  if timeout 5 bash -c '</dev/tcp/"$1"/"$2"' bash "$1" "$2" 2>/dev/null; then echo registry=1; else echo registry=0; fi
fi
