# shellcheck shell=sh
# Run once by cloud-init on a VM that `launcher vm up` made (runcmd): what the image lacks for
# launcher. POSIX sh; $1 is the admin user. Idempotent; the last line marks the VM ready.
set -eu
user="$1"
export DEBIAN_FRONTEND=noninteractive
systemd=no
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then systemd=yes; fi
if ! command -v docker >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq docker.io >/dev/null
fi
if [ "$systemd" = yes ]; then systemctl enable --now docker >/dev/null 2>&1 || true; fi
# The GPU images carry the NVIDIA Container Toolkit; make sure Docker knows its runtime.
if command -v nvidia-ctk >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1; then
  if ! docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia; then
    nvidia-ctk runtime configure --runtime=docker >/dev/null
    if [ "$systemd" = yes ]; then systemctl restart docker; fi
  fi
fi
if getent group docker >/dev/null 2>&1; then usermod -aG docker "$user"; fi
mkdir -p /var/lib/launcher
date -u +%Y-%m-%dT%H:%M:%SZ > /var/lib/launcher/vm-ready
