"""The Slurm placement's generated commands and its reading of sacct, without a cluster: what the
real-cluster tests (test_slurm_runs.py) cannot reach here, a Pyxis/enroot cluster and Slurm accounting."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from launcher.hosts.base import Host
from launcher.hosts.scripts import text as host_script
from launcher.proc import Completed
from launcher.runtime.recipespec import RecipeSpec
from launcher.specs.container import ContainerJob, runtime_argv
from launcher.specs.recipes import Recipe
from launcher.targets.slurm import SlurmPlacement, pyxis_image, pyxis_srun_argv

DIGEST = "sha256:" + "d" * 64
IMAGE = "sha256:" + "a" * 64
REF = f"registry.lab.example:5000/launcher/ship@{DIGEST}"


@dataclass
class FakeLogin:
    """A login node that answers each command from a table of canned results (prefix match)."""

    answers: dict[tuple[str, ...], tuple[int, str, str]] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)
    name: str = "login"
    kind: str = "ssh"

    def run(self, argv: list[str], check: bool = False, **_: Any) -> Completed:
        self.calls.append(list(argv))
        for prefix, (rc, out, err) in self.answers.items():
            if tuple(argv[: len(prefix)]) == prefix:
                return Completed(tuple(argv), rc, out.encode(), err.encode())
        return Completed(tuple(argv), 0, b"", b"")

    def runs_root(self) -> str:
        return "/home/u/.launcher/runs"

    area = Host.area  # the Host operations made of run() and runs_root(), as a real host has them
    write_atomic = Host.write_atomic

    def read_text(self, path: str) -> str | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "ssh"}


def _job(tmp: Path, **kw: Any) -> ContainerJob:
    recipe = Recipe(RecipeSpec(Path("/r/tiny"), "tiny", "none", "train.py"), "sha256:" + "0" * 64)
    return ContainerJob(run_id="20260101T000000-tiny-abcdef", image_id=IMAGE,
                        env={"LAUNCHER_SEED": "7", "TF_DETERMINISTIC_OPS": "1", "PYTHONHASHSEED": "7"},
                        host_out=str(tmp / "run" / "out"), recipe=recipe, params={"msg": "it's"},
                        data="/data/my set", **kw)


def _write_task(placement: SlurmPlacement, job: ContainerJob, run_dir: Path, owner: str | None) -> list[str]:
    """Write the task script and its values into run_dir as start_array does; its values, as fields."""
    run_dir.mkdir(parents=True, exist_ok=True)
    args = placement._task_args(job, owner)
    (run_dir / "task.args").write_bytes(args)
    (run_dir / "task.sh").write_text(host_script("slurm_task.sh"))
    assert args.endswith(b"\0")
    return args[:-1].decode().split("\0")


def _pyxis(login: FakeLogin) -> SlurmPlacement:
    placement = SlurmPlacement(login)  # type: ignore[arg-type]
    placement.settings = {"registry": "registry.lab.example:5000", "runtime": "pyxis"}
    placement.image_source = {"kind": "registry", "registry": "registry.lab.example:5000", "ref": REF}
    return placement


def test_pyxis_names_the_image_by_registry_hash_repository_and_digest() -> None:
    assert pyxis_image(REF) == f"registry.lab.example:5000#launcher/ship@{DIGEST}"


def test_the_pyxis_step_has_the_run_contract_mounts_env_names_and_command(tmp_path: Path) -> None:
    job = _job(tmp_path)
    argv = pyxis_srun_argv(job, REF)
    assert argv[:2] == ["srun", "--ntasks=1"]
    opts = dict(a.split("=", 1) for a in argv if a.startswith("--container"))
    assert opts["--container-image"] == f"registry.lab.example:5000#launcher/ship@{DIGEST}"
    assert opts["--container-mounts"].split(",") == [f"{tmp_path}/run/out:/launcher/out",
                                                     "/data/my set:/launcher/data:ro"]
    assert opts["--container-env"].split(",") == sorted(job.env)
    assert "--no-container-mount-home" in argv
    assert argv[-len(runtime_argv(job)):] == runtime_argv(job)


def test_the_generated_pyxis_task_runs_srun_with_the_determinism_env_and_records_the_result(tmp_path: Path) -> None:
    """Run the generated task script with bash, a stand-in `srun` first on PATH recording what it got."""
    job = _job(tmp_path)
    run_dir = tmp_path / "run"
    (run_dir / "out").mkdir(parents=True)
    fields = _write_task(_pyxis(FakeLogin()), job, run_dir, owner=None)
    assert "docker" not in fields and fields[0] == "pyxis"  # no engine on a Pyxis node
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "srun.json"
    fake = bin_dir / "srun"
    fake.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(seen)!r}, 'w'))\n"
        "sys.exit(int(os.environ.get('FAKE_RC', '0')))\n"
    )
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURMD_NODENAME": "gpu07",
           "SLURM_ARRAY_JOB_ID": "41", "SLURM_ARRAY_TASK_ID": "0", "SLURM_JOB_PARTITION": "a100"}
    done = subprocess.run(["bash", str(run_dir / "task.sh")], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(seen.read_text())
    assert got["argv"] == pyxis_srun_argv(job, REF)[1:]
    assert {k: got["env"][k] for k in job.env} == dict(job.env)
    task = json.loads((run_dir / "task.json").read_text())
    assert (task["status"], task["exit_code"], task["node"], task["job_id"], task["partition"]) == (
        "succeeded", 0, "gpu07", "41", "a100")
    assert task["image_ran"] == IMAGE
    done = subprocess.run(["bash", str(run_dir / "task.sh")], env={**env, "FAKE_RC": "3"}, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 3
    assert json.loads((run_dir / "task.json").read_text())["status"] == "failed"


def test_a_docker_task_pulls_by_digest_and_quotes_what_docker_said_into_valid_json(tmp_path: Path) -> None:
    login = FakeLogin()
    placement = _pyxis(login)
    placement.settings["runtime"] = "docker"
    fields = _write_task(placement, _job(tmp_path), tmp_path / "run", owner="1000:1000")
    assert fields[4:6] == ["registry", REF] and fields[7:10] == ["0", "docker", "run"]
    assert 'docker pull -q "$SOURCE"' in host_script("slurm_task.sh")
    (tmp_path / "run" / "out").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(  # an engine without the image whose pull fails with a quoted message
        '#!/bin/sh\ncase "$1" in pull) echo \'Error response from daemon: manifest "x" unknown\\\\\' >&2; exit 1;; '
        "*) exit 1;; esac\n")
    (bin_dir / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURMD_NODENAME": "n3"}
    done = subprocess.run(["bash", str(tmp_path / "run" / "task.sh")], env=env, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 125
    task = json.loads((tmp_path / "run" / "task.json").read_text())
    assert task["status"] == "failed" and "does not have the pinned image" in task["error"]
    assert "manifest x unknown" in task["error"]


LAUNCH = {"run_id": "r1", "slurm": {"job_id": "41", "array_index": 2, "log": "/x", "run_dir": "/home/u/r1"}}


@pytest.mark.parametrize(("sacct", "status", "code", "node"), [
    ("CANCELLED by 1000|0:15|None assigned\n", "cancelled", None, None),
    ("NODE_FAIL|0:0|gpu03\n", "failed", 0, "gpu03"),
    ("TIMEOUT|0:0|gpu04\n", "failed", 0, "gpu04"),
    ("OUT_OF_MEMORY|0:125|gpu05\n", "failed", 0, "gpu05"),
])
def test_a_task_that_wrote_no_result_is_explained_by_sacct(sacct: str, status: str, code: int | None,
                                                           node: str | None) -> None:
    login = FakeLogin({("squeue",): (0, "", ""), ("sacct",): (0, sacct, "")})
    state = SlurmPlacement(login).state(LAUNCH)  # type: ignore[arg-type]
    assert state is not None and state.ended
    assert (state.status, state.exit_code, state.info["node"]) == (status, code, node)
    assert f"Slurm says {sacct.split('|')[0]}" in state.info["error"]
    assert ["sacct", "-n", "-P", "-X", "-j", "41_2", "-o", "State,ExitCode,NodeList"] in login.calls


def test_without_accounting_the_fallback_says_why_it_cannot_tell() -> None:
    login = FakeLogin({("squeue",): (0, "", ""),
                       ("sacct",): (1, "", "sacct: error: Slurm accounting storage is disabled\n")})
    state = SlurmPlacement(login).state(LAUNCH)  # type: ignore[arg-type]
    assert state is not None and state.status == "cancelled"
    assert "keeps no accounting" in state.info["error"]


def test_a_pyxis_task_gets_the_users_env_and_its_secret_from_a_file_it_removes(tmp_path: Path) -> None:
    job = _job(tmp_path, user_env={"MODE": "fast run"}, secret_env={"TOKEN": "hunter2 x=y"})
    run_dir = tmp_path / "run"
    (run_dir / "out").mkdir(parents=True)
    env_file = run_dir / "secret.env"
    env_file.write_text("TOKEN=hunter2 x=y\n")
    job = replace(job, env_file=str(env_file))
    fields = _write_task(_pyxis(FakeLogin()), job, run_dir, owner=None)
    assert not any("hunter2" in f for f in fields)
    argv = pyxis_srun_argv(job, REF)
    names = next(a for a in argv if a.startswith("--container-env=")).partition("=")[2].split(",")
    assert {"MODE", "TOKEN", "LAUNCHER_SEED"} <= set(names)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "srun.json"
    (bin_dir / "srun").write_text("#!/usr/bin/env python3\nimport json, os, sys\n"
                                  f"json.dump(dict(os.environ), open({str(seen)!r}, 'w'))\n")
    (bin_dir / "srun").chmod(0o755)
    done = subprocess.run(["bash", str(run_dir / "task.sh")], capture_output=True, text=True, check=False,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    got = json.loads(seen.read_text())
    assert (got["MODE"], got["TOKEN"]) == ("fast run", "hunter2 x=y")
    assert not env_file.exists()  # removed when the task ended


@dataclass
class _RecordingLogin(FakeLogin):
    """A login node that keeps every command with what was written to its stdin; it owns files as 1000:1000."""

    inputs: list[tuple[list[str], bytes | None]] = field(default_factory=list)

    def run(self, argv: list[str], check: bool = False, **kw: Any) -> Completed:
        self.inputs.append((list(argv), kw.get("input")))
        return super().run(argv, check, **kw)

    def owner(self) -> str:
        return "1000:1000"

    def makedirs(self, path: str) -> None:
        pass


def test_a_docker_task_passes_secrets_by_env_file_written_through_stdin(tmp_path: Path) -> None:
    login = _RecordingLogin({("sbatch", "--parsable"): (0, "41\n", "")})
    placement = SlurmPlacement(login)  # type: ignore[arg-type]
    placement.settings = {"runtime": "docker"}
    placement.start_array([_job(tmp_path, secret_env={"TOKEN": "hunter2"})])
    secret_writes = [(argv, data) for argv, data in login.inputs if data and b"hunter2" in data]
    assert len(secret_writes) == 1
    argv, data = secret_writes[0]
    assert "umask 077" in argv[2] and argv[-1] == f"{tmp_path}/run/secret.env" and data == b"TOKEN=hunter2\n"
    args = next(d for a, d in login.inputs if a[-1].endswith("/task.args"))
    assert args is not None and b"hunter2" not in args
    assert f"\0--env-file\0{tmp_path}/run/secret.env\0".encode() in args
    assert next(d for a, d in login.inputs if a[-1].endswith("/task.sh")) == host_script("slurm_task.sh").encode()
    assert not any(b"hunter2" in " ".join(a).encode() for a, _ in login.inputs)


def test_the_task_script_writes_the_files_the_placement_reads(tmp_path: Path) -> None:
    """slurm_task.sh names task.json and the node's facts itself: the names targets.slurm reads."""
    from launcher.targets.slurm import NODE_ARGS, NODE_FACTS, TASK_ARGS, TASK_FILE

    script = host_script("slurm_task.sh")
    assert f"RESULT={TASK_FILE} FACTS_FILE={NODE_FACTS} ARGS_FILE={TASK_ARGS}" in script
    assert f"ARGS_FILE={NODE_ARGS.format('$K')}" in script  # one node of several: its own values
    assert '"$RUN/$RESULT"' in script and '"$RUN/$FACTS_FILE"' in script and '"$RUN/$ARGS_FILE"' in script
    assert f'"$RUN/{TASK_FILE}.part"' in host_script("slurm_nodes.sh")  # the job of several nodes: its result


def test_a_docker_task_without_the_shared_archive_runs_nothing(tmp_path: Path) -> None:
    placement = SlurmPlacement(FakeLogin())  # type: ignore[arg-type]
    placement.settings = {"runtime": "docker"}
    placement.image_source = {"kind": "shared"}
    run_dir = tmp_path / "run"
    fields = _write_task(placement, _job(tmp_path), run_dir, owner=None)
    assert fields[4] == "shared" and fields[5].endswith(f"/images/{IMAGE.removeprefix('sha256:')}.tar")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\necho \"$*\" >> \"$CALLS\"\nexit 1\n")  # no image, nothing runs
    (bin_dir / "docker").chmod(0o755)
    calls = tmp_path / "calls"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls)}
    done = subprocess.run(["bash", str(run_dir / "task.sh")], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 125
    assert json.loads((run_dir / "task.json").read_text())["status"] == "failed"
    fetched = [c.split()[0] for c in calls.read_text().splitlines() if c.split()[0] in ("image", "load", "pull", "run")]
    assert fetched == ["image", "image"]  # looked for twice; nothing loaded (no archive) and nothing run
    assert (run_dir / "node-facts.txt").read_text().startswith("os=")


def test_the_array_is_the_package_script_with_its_sbatch_options_on_the_command_line(tmp_path: Path) -> None:
    login = _RecordingLogin({("sbatch", "--parsable"): (0, "41\n", "")})
    placement = SlurmPlacement(login, partition="gpu", options={"time": "10"}, max_parallel=2)  # type: ignore[arg-type]
    placement.settings = {"runtime": "docker"}
    jobs = [replace(_job(tmp_path), run_id=f"r{i}", host_out=str(tmp_path / f"r{i}" / "out")) for i in range(3)]
    placed = placement.start_array(jobs)
    array_dir = "/home/u/.launcher/slurm/r0"
    written = {a[-1]: d for a, d in login.inputs if d is not None}
    assert written[f"{array_dir}/array.sh"] == host_script("slurm_array.sh").encode()
    assert b"SBATCH" not in written[f"{array_dir}/array.sh"]
    assert written[f"{array_dir}/tasks"] == b"".join(f"{tmp_path}/r{i}/task.sh".encode() + b"\0" for i in range(3))
    sbatch = next(a for a, _ in login.inputs if a[0] == "sbatch")
    assert sbatch == ["sbatch", "--parsable", "--job-name=launcher", "--array=0-2%2", "--partition=gpu", "--time=10",
                      f"--output={array_dir}/task-%a.log", "--open-mode=append", f"{array_dir}/array.sh", array_dir]
    assert [p["slurm"]["array_index"] for p in placed] == [0, 1, 2]


def test_the_array_script_runs_the_task_of_its_index(tmp_path: Path) -> None:
    from launcher.targets.slurm import ARRAY_TASKS

    assert f'"$ARRAY_DIR/{ARRAY_TASKS}"' in host_script("slurm_array.sh")  # the name start_array writes
    array_dir = tmp_path / "array dir"
    array_dir.mkdir()
    (array_dir / "array.sh").write_text(host_script("slurm_array.sh"))
    tasks = []
    for i in range(3):
        run = tmp_path / f"run {i}"
        run.mkdir()
        (run / "task.sh").write_text(f'echo "task {i} in ${{0%/*}}"\n')
        tasks.append(f"{run}/task.sh")
    (array_dir / "tasks").write_bytes(b"".join(t.encode() + b"\0" for t in tasks))
    for index in ("1", "2"):
        done = subprocess.run(["bash", str(array_dir / "array.sh"), str(array_dir)], capture_output=True, text=True,
                              check=False, env={**os.environ, "SLURM_ARRAY_TASK_ID": index})
        assert (done.returncode, done.stdout) == (0, f"task {index} in {tmp_path}/run {index}\n"), done.stderr
    done = subprocess.run(["bash", str(array_dir / "array.sh"), str(array_dir)], capture_output=True, text=True,
                          check=False, env={**os.environ, "SLURM_ARRAY_TASK_ID": "3"})
    assert done.returncode == 2 and "no task script" in done.stderr
