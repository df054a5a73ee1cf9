# shellcheck shell=sh
# Runs on the host with POSIX sh, sent as text by provision.gather_facts: the read-only fact
# sheet, one key=value per line (gpu= once per GPU). It changes nothing on the host.
export LC_ALL=C
# shellcheck source=/dev/null
if [ -r /etc/os-release ]; then . /etc/os-release; fi
echo "os=${PRETTY_NAME:-unknown}"
echo "os_id=${ID:-unknown}"
echo "os_version=${VERSION_ID:-}"
echo "os_codename=${VERSION_CODENAME:-}"
echo "kernel=$(uname -r)"
echo "arch=$(uname -m)"
echo "user=$(id -un)"
echo "uid=$(id -u)"
echo "cpu_model=$(sed -n 's/^model name[[:space:]]*: *//p' /proc/cpuinfo | head -n1)"
echo "cpu_cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || nproc)"
echo "ram_bytes=$(awk '/^MemTotal:/ {printf "%.0f", $2 * 1024}' /proc/meminfo)"
echo "disk_free_bytes=$(df -Pk "$HOME" | awk 'NR==2 {printf "%.0f", $4 * 1024}')"
# systemd runs the services (sd_booted's test); without it provision starts dockerd itself
if [ -d /run/systemd/system ]; then echo "systemd=1"; else echo "systemd=0"; fi
if command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then echo "sudo=1"; else echo "sudo=0"; fi
if command -v docker >/dev/null 2>&1; then
  echo "docker_installed=1"
  echo "docker_client=$(docker --version 2>/dev/null)"
  if out=$(docker info --format '{{.ServerVersion}}|{{json .Runtimes}}|{{.DockerRootDir}}' 2>&1); then
    echo "docker_usable=1"
    echo "docker_info=$out"
  else
    echo "docker_usable=0"
    # docker version says why (no daemon, or a socket this user may not open); info's --format hides it
    why=$(docker version --format '{{.Server.Version}}' 2>&1 >/dev/null | tail -n1)
    echo "docker_error=$(printf '%s' "${why:-$out}" | tail -n1)"
  fi
else
  echo "docker_installed=0"
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "nvidia_smi=1"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
    | sed 's/^/gpu=/'
else
  echo "nvidia_smi=0"
fi
if command -v nvidia-ctk >/dev/null 2>&1; then echo "nvidia_ctk=1"; else echo "nvidia_ctk=0"; fi
