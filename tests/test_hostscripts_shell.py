"""The shell scripts launcher sends to hosts (launcher/hosts/scripts/*.sh, launcher/vms/setup.sh): clean
under shellcheck, and what they do, run here with stand-ins for docker and enroot first on PATH."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import launcher
from launcher.hosts.scripts import text as host_script

PACKAGE = Path(launcher.__file__).parent


def test_shell_scripts_are_clean_under_shellcheck() -> None:
    scripts = sorted(PACKAGE.rglob("*.sh"))
    assert scripts, "no shell scripts found in the package"
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (Debian: apt-get install shellcheck; scripts/setup.sh does)")
    done = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def _stand_in(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + body)
    (bin_dir / name).chmod(0o755)


def _sh(script: str, *args: str, bin_dir: Path, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(["sh", "-c", host_script(script), "sh", *args], input=input, env=env,
                          capture_output=True, check=False)


def test_the_node_probe_reports_docker_runtimes_enroot_and_the_registry(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "docker", 'echo "docker=24.0.7 runtimes=io.containerd.runc.v2,nvidia,runc,"\n')
    _stand_in(bin_dir, "enroot", "exit 0\n")
    done = _sh("node_probe.sh", bin_dir=bin_dir)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split() == ["docker=24.0.7", "runtimes=io.containerd.runc.v2,nvidia,runc,",
                                            "enroot=1"]
    # a port nothing listens on (the probe only talks to the registry address it is given: loopback here)
    done = _sh("node_probe.sh", "127.0.0.1", "9", bin_dir=bin_dir)
    assert done.stdout.decode().split()[-1] == "registry=0"


def test_the_node_probe_without_docker_says_so(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "docker", "echo 'Cannot connect to the Docker daemon' >&2; exit 1\n")
    out = _sh("node_probe.sh", bin_dir=bin_dir).stdout.decode().split()
    assert out[0] == "docker=" and "registry=0" not in out and "registry=1" not in out


def test_the_staged_load_feeds_docker_load_one_archive_with_empty_layers(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "001.tar.gz").write_bytes(b"layer one")
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "docker", f'[ "$*" = "load -q" ] || exit 9\ncat > {tmp_path}/loaded.tar\necho Loaded\n')
    manifest = json.dumps([{"Config": "config.json", "RepoTags": [], "Layers": ["000.empty", "001.tar.gz"]}])
    done = _sh("stage_load.sh", str(stage), "000.empty", manifest, "000.empty 001.tar.gz", bin_dir=bin_dir,
               input=b'{"config": 1}')
    assert done.returncode == 0, done.stderr
    listed = subprocess.run(["tar", "-tvf", str(tmp_path / "loaded.tar")], capture_output=True, text=True,
                            check=True).stdout.split("\n")
    names = [line.split()[-1] for line in listed if line]
    assert names == ["config.json", "manifest.json", "000.empty", "001.tar.gz"]
    assert (stage / "config.json").read_bytes() == b'{"config": 1}'
    assert json.loads((stage / "manifest.json").read_text())[0]["Layers"] == ["000.empty", "001.tar.gz"]
    assert (stage / "000.empty").stat().st_size == 0


def test_dockerd_wait_gives_up_saying_how_the_log_ends(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "docker", "exit 1\n")
    _stand_in(bin_dir, "sleep", "exit 0\n")
    log = tmp_path / "dockerd.log"
    log.write_text("starting\nfailed to start daemon: no space\n")
    done = _sh("dockerd.sh", "wait", str(log), "3", bin_dir=bin_dir)
    assert done.returncode == 1
    said = done.stderr.decode().strip()
    assert said == f"Docker did not answer within 3 s; {log} ends: failed to start daemon: no space"
    _stand_in(bin_dir, "docker", "exit 0\n")
    assert _sh("dockerd.sh", "wait", str(log), "3", bin_dir=bin_dir).returncode == 0
    assert _sh("dockerd.sh", "restart", str(log), "3", bin_dir=bin_dir).returncode == 2


def test_write_atomic_writes_whole_files_in_new_folders_and_private_ones_for_the_user_alone(tmp_path: Path) -> None:
    from launcher.hosts.base import write_atomic_argv

    target = tmp_path / "new dir" / "it's.txt"
    done = subprocess.run(write_atomic_argv(str(target)), input=b"one\n", capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == b"one\n" and not (tmp_path / "new dir" / "it's.txt.part").exists()
    secret = tmp_path / "secrets" / "env"
    done = subprocess.run(write_atomic_argv(str(secret), private=True), input=b"T=1\n", capture_output=True,
                          check=False)
    assert done.returncode == 0 and secret.read_bytes() == b"T=1\n"
    assert secret.stat().st_mode & 0o077 == 0
    blocked = tmp_path / "file"
    blocked.write_text("x")
    done = subprocess.run(write_atomic_argv(str(blocked / "under a file")), input=b"x", capture_output=True,
                          check=False)
    assert done.returncode != 0


FAKE_SRUN = """#!/bin/bash
# srun's stand-in: the last argument (task.sh) once per node, SLURM_NODEID set; SIGTERM passed on to them
PIDS=()
for K in 0 1; do SLURM_NODEID=$K bash "${@: -1}" & PIDS+=($!); done
trap 'kill -TERM "${PIDS[@]}" 2>/dev/null' TERM
RC=0
for P in "${PIDS[@]}"; do wait "$P" || RC=$?; done
for P in "${PIDS[@]}"; do wait "$P" 2>/dev/null; done
exit $RC
"""
# A node's task (task.sh's stand-in): node 1 fails at once when told to (FAIL_NODE1), else every node runs until
# stopped; a stopped node records 143 as slurm_task.sh does
FAKE_TASK = """#!/bin/bash
RUN=${0%/*}
result() {
  echo "{\\"exit_code\\": $1, \\"status\\": \\"$2\\", \\"image_ran\\": \\"sha256:abc\\"}" \
    > "$RUN/node-$SLURM_NODEID.json"
}
echo "$LAUNCHER_NODE_HOSTS" > "$RUN/hosts-$SLURM_NODEID"
if [ "$SLURM_NODEID" = 1 ] && [ -n "${FAIL_NODE1:-}" ]; then sleep 0.3; result 137 failed; exit 137; fi
trap 'result 143 cancelled; exit 143' TERM
for _ in $(seq 600); do sleep 0.1; done
result 0 succeeded
"""


def _nodes_job(tmp_path: Path, **env: str) -> tuple[Path, subprocess.Popen[bytes]]:
    """slurm_nodes.sh started in a run folder as a Slurm job of nodes node1 and node2 would start it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "nodes.sh").write_text(host_script("slurm_nodes.sh"))
    (run / "task.sh").write_text(FAKE_TASK)
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "scontrol", 'test "$1 $2 $3" = "show hostnames node[1-2]" && printf "node1\\nnode2\\n"\n')
    _stand_in(bin_dir, "scancel", "exit 1\n")  # no controller here: the script signals its step itself
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    job_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[1-2]",
               "SLURM_JOB_ID": "41", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "1", **env}
    return run, subprocess.Popen(["bash", str(run / "nodes.sh")], env=job_env)


def test_a_job_of_two_nodes_stops_the_other_node_when_one_fails_and_names_it(tmp_path: Path) -> None:
    run, job = _nodes_job(tmp_path, FAIL_NODE1="1")
    assert job.wait(timeout=60) == 137
    assert (run / "hosts-0").read_text().strip() == (run / "hosts-1").read_text().strip() == "node1,node2"
    # node 0 would have run for a minute: it was stopped, and the run's result names node 1 and its exit code
    assert json.loads((run / "node-0.json").read_text())["exit_code"] == 143
    task = json.loads((run / "task.json").read_text())
    assert (task["exit_code"], task["status"], task["error"]) == (137, "failed", "node 1 failed (exit 137)")
    assert (task["node"], task["nodes"], task["job_id"], task["array_index"]) == ("node1", "node1,node2", "40", "1")
    assert task["image_ran"] == "sha256:abc"


def test_a_job_of_two_nodes_cancelled_stops_both_and_says_cancelled(tmp_path: Path) -> None:
    import signal
    import time

    run, job = _nodes_job(tmp_path)
    deadline = time.monotonic() + 30
    while not ((run / "hosts-0").exists() and (run / "hosts-1").exists()):
        assert time.monotonic() < deadline and job.poll() is None
        time.sleep(0.05)
    job.send_signal(signal.SIGTERM)  # scancel: the batch script gets SIGTERM
    assert job.wait(timeout=60) == 143
    task = json.loads((run / "task.json").read_text())
    assert (task["status"], task["exit_code"]) == ("cancelled", 143)
    assert [json.loads((run / f"node-{k}.json").read_text())["exit_code"] for k in (0, 1)] == [143, 143]
