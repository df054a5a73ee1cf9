#!/usr/bin/env bash
# Set up a Debian/Ubuntu machine for launcher: Docker engine, local registry tools,
# debootstrap, OpenSSH, shellcheck (for the scripts launcher sends to hosts), and a virtualenv
# with launcher installed. Idempotent.
# `--fast`: only what the fast tier of the tests needs, the virtualenv and shellcheck (root only to
# install a missing shellcheck): no Docker engine, no registry.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=false
[ "${1:-}" = "--fast" ] && fast=true

tools="dockerd:docker.io debootstrap:debootstrap docker-registry:docker-registry skopeo:skopeo
       sshd:openssh-server ssh:openssh-client scp:openssh-client iptables:iptables shellcheck:shellcheck"
$fast && tools="shellcheck:shellcheck"
need_pkgs=()
for pair in $tools; do
  cmd=${pair%%:*}; pkg=${pair##*:}
  if ! command -v "$cmd" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$cmd" ]; then need_pkgs+=("$pkg"); fi
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: ${need_pkgs[*]} missing: install as root (apt-get install ${need_pkgs[*]})" >&2; exit 1
  fi
  echo "setup: installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if ! $fast && ! docker info >/dev/null 2>&1; then
  echo "setup: starting the Docker engine"
  (dockerd >/var/log/dockerd.log 2>&1 &)
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start, see /var/log/dockerd.log" >&2; exit 1; }
fi

if [ ! -x .venv/bin/launcher ] || [ pyproject.toml -nt .venv/.installed ]; then
  echo "setup: installing launcher into .venv"
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip >/dev/null 2>&1
  if ! .venv/bin/pip install -q -e ".[dev]" >.venv/install.log 2>&1; then
    tail -20 .venv/install.log >&2; echo "setup: pip install failed (full log: .venv/install.log)" >&2; exit 1
  fi
  touch .venv/.installed
fi

if $fast; then echo "setup: ready for the fast tier (no Docker engine or registry needed)"; exit 0; fi
.venv/bin/launcher base registry >/dev/null
echo "setup: ready (docker $(docker version --format '{{.Server.Version}}'), registry on 127.0.0.1:5000)"
