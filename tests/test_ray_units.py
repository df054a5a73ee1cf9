"""The Ray target without a cluster: the outputs stream a node sends the head (and what a hostile one cannot do),
the head's side of the tasks, --ray-opt, the task the driver gets, the states read back, the usage errors."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode, UsageError
from launcher.hosts.local import LocalHost
from launcher.hosts.scripts import ray_job
from launcher.runtime.recipespec import RecipeSpec
from launcher.specs.container import ContainerJob
from launcher.specs.recipes import Recipe
from launcher.targets import ray as ray_target
from launcher.targets.ray import RayPlacement, parse_ray_opts

runner = CliRunner()


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return buf


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o644
    return info


def test_outputs_travel_whole_links_as_links_and_hard_links_as_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "model").mkdir(parents=True)
    (out / "model" / "w.bin").write_bytes(b"\x00weights" * 1000)
    os.link(out / "model" / "w.bin", out / "model" / "same.bin")  # a hard link: sent as a second whole file
    (out / "passwd").symlink_to("/etc/passwd")  # a link the training code left: kept a link, never followed
    os.mkfifo(out / "pipe")  # neither file, folder nor link: left out
    stream = io.BytesIO()
    ray_job.pack(str(out), stream)
    stream.seek(0)
    names = {m.name: m for m in tarfile.open(fileobj=io.BytesIO(stream.getvalue()))}
    assert set(names) == {"model", "model/w.bin", "model/same.bin", "passwd"}
    assert names["model/same.bin"].isreg() and names["passwd"].issym()
    back = tmp_path / "back"
    back.mkdir()
    assert ray_job.unpack(stream, str(back)) == 4
    assert (back / "model" / "same.bin").read_bytes() == (out / "model" / "w.bin").read_bytes()
    assert os.readlink(back / "passwd") == "/etc/passwd"


@pytest.mark.parametrize("members, why", [
    ([(_member("/etc/cron.d/x"), b"pwned")], "not a plain relative path"),
    ([(_member("../outside"), b"pwned")], "not a plain relative path"),
    ([(_member("a/../../outside"), b"pwned")], "not a plain relative path"),
    ([(_member("link", tarfile.SYMTYPE, "/tmp"), None), (_member("link/x"), b"pwned")], "on its way is a symlink"),
    ([(_member("link", tarfile.SYMTYPE, "../victim"), None), (_member("link"), b"pwned")], "already a symlink"),
    ([(_member("f"), b"one"), (_member("f", tarfile.SYMTYPE, "/etc/passwd"), None)], "a symlink over a file"),
    ([(_member("hard", tarfile.LNKTYPE, "../victim"), None)], "not a folder, file or symlink"),
    ([(_member("dev", tarfile.CHRTYPE), None)], "not a folder, file or symlink"),
])
def test_a_hostile_outputs_stream_writes_nothing_outside_its_folder(
        tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], why: str) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    folder = tmp_path / "run" / "out"
    folder.mkdir(parents=True)
    with pytest.raises(ray_job.Refused, match=why):
        ray_job.unpack(_tar(members), str(folder))
    assert victim.read_text() == "untouched\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "victim"]


def _head(tmp_path: Path) -> tuple[ray_job.HeadFiles, Path]:
    area = tmp_path / "area"
    run_dir = area / "runs" / "r1"
    (run_dir / "out").mkdir(parents=True)
    (area / "data" / "d1").mkdir(parents=True)
    (area / "data" / "d1" / "x.txt").write_text("data\n")
    (run_dir / "secret.env").write_text("TOKEN=s3cr3t\n")
    (area / "images").mkdir()
    (area / "images" / "img.tar").write_bytes(b"image bytes")
    job = {"area": str(area), "tasks": [{"run_id": "r1", "run_dir": str(run_dir),
                                         "image_archive": str(area / "images" / "img.tar"),
                                         "inputs": {"data": "data/d1", "secret": "runs/r1/secret.env"}}]}
    return ray_job.HeadFiles(job), run_dir


def test_the_head_serves_only_the_inputs_of_its_runs_and_checks_what_comes_back(tmp_path: Path) -> None:
    head, run_dir = _head(tmp_path)
    token, sha, size = head.open("r1", "image")
    assert head.read(token, 0, 100) == b"image bytes" and sha == hashlib.sha256(b"image bytes").hexdigest()
    token, sha, size = head.open("r1", "data")  # a folder: packed once, then served
    assert ray_job.unpack(io.BytesIO(head.read(token, 0, size)), str(tmp_path)) == 1
    assert (tmp_path / "x.txt").read_text() == "data\n"
    for run_id, which in (("r1", "../../etc"), ("r1", "code"), ("r2", "data")):
        with pytest.raises(KeyError):
            head.open(run_id, which)
    with pytest.raises(KeyError):
        head.read("/etc/shadow", 0, 100)  # only what it served
    head.open("r1", "secret")
    head.forget_secret("r1")
    assert not (run_dir / "secret.env").exists()

    stream = io.BytesIO()
    ray_job.pack(str(tmp_path / "area" / "data"), stream)
    data = stream.getvalue()
    path = head.begin_outputs("r1")
    head.put("r1", path, data[:10])
    why = head.end_outputs("r1", path, hashlib.sha256(data).hexdigest(), len(data))  # cut short on the way
    assert "arrived damaged" in why and not os.path.exists(path) and os.listdir(run_dir / "out") == []
    path = head.begin_outputs("r1")
    head.put("r1", path, data)
    assert head.end_outputs("r1", path, hashlib.sha256(data).hexdigest(), len(data)) == ""
    assert (run_dir / "out" / "d1" / "x.txt").read_text() == "data\n"
    with pytest.raises(KeyError):
        head.put("r1", str(tmp_path / "victim.tar"), b"x")  # a stream outside the run's folder
    head.cleanup()


def test_ray_opts_are_task_resources() -> None:
    assert parse_ray_opts(["num_cpus=2", "num-gpus=1", "memory=8G"]) == {
        "num_cpus": 2.0, "num_gpus": 1.0, "memory": float(8 << 30)}
    for bad, said in (("partition=debug", "not a task resource"), ("num_cpus=two", "not a number"),
                      ("memory=-1", "not a number")):
        with pytest.raises(UsageError, match=said):
            parse_ray_opts([bad])


def _job(host: LocalHost, **kw: Any) -> ContainerJob:
    run_dir = host.run_dir("r1")
    recipe = Recipe(RecipeSpec(Path("/r/tiny"), "tiny", "none", "train.py"), "sha256:" + "0" * 64)
    return ContainerJob(run_id="r1", image_id="sha256:" + "ab" * 32, env={"PYTHONHASHSEED": "0"},
                        host_out=f"{run_dir}/out", recipe=recipe, params={}, **kw)


def test_a_task_names_the_nodes_area_by_a_mark_and_fetches_only_what_is_in_the_heads(tmp_path: Path) -> None:
    host = LocalHost(tmp_path)
    placement = RayPlacement(host, resources={"num_cpus": 2.0})
    job = _job(host, data=host.area("data", "d1"), host_code=host.area("code", "c1"), code_entry="train.py",
               env_file=f"{host.run_dir('r1')}/secret.env", secret_env={"TOKEN": "s3cr3t"})
    task = placement._task(job)
    area = host.area()
    runs = host.runs_root()[len(area) + 1:]  # the runs' folder in the area ("runs" on an SSH host)
    assert task["inputs"] == {"data": "data/d1", "code": "code/c1", "secret": f"{runs}/r1/secret.env"}
    assert task["run_dir"] == host.run_dir("r1") and len(task["nodes"]) == 1
    argv = " ".join(task["nodes"][0]["argv"])
    assert area not in argv and "@RUN@/out:/launcher/out" in argv and "LAUNCHER_OWNER=@OWNER@" in argv
    assert "@AREA@/data/d1:/launcher/data:ro" in argv and "@AREA@/code/c1:/launcher/code:ro" in argv
    assert "--env-file @RUN@/secret.env" in argv and "s3cr3t" not in json.dumps(task)
    (unit,) = ray_job.units(task)
    assert unit["folder"] == "r1" and unit["container"] == "launcher-r1" and unit["node"] == 0
    filled = ray_job.fill(unit["argv"], "/home/u/.launcher/ray-node", "1000:1000", "/home/u/.launcher/ray-node/runs/r1")
    assert "/home/u/.launcher/ray-node/data/d1:/launcher/data:ro" in filled and "LAUNCHER_OWNER=1000:1000" in filled
    assert "/home/u/.launcher/ray-node/runs/r1/out:/launcher/out" in filled
    # a data path outside launcher's area is one every node is taken to have: mounted as it is, not fetched
    task = placement._task(_job(host, data="/mnt/shared/imagenet"))
    assert "data" not in task["inputs"] and "/mnt/shared/imagenet:/launcher/data:ro" in task["nodes"][0]["argv"]


def test_a_run_of_two_nodes_is_a_task_per_node_in_its_own_folder_with_the_peers_filled_in(tmp_path: Path) -> None:
    from launcher.specs.topology import Topology

    host = LocalHost(tmp_path)
    placement = RayPlacement(host)
    topology = placement.topology_for(Topology(nodes=2, procs_per_node=2).for_framework("torch"))
    assert topology is not None and topology.network == "host"
    task = placement._task(_job(host, topology=topology))
    zero, one = ray_job.units(task, ["10.0.0.5", "10.0.0.6"])
    assert (zero["folder"], one["folder"]) == ("r1", "r1-node1") and one["container"] == "launcher-r1-node1"
    assert one["make"] == ["out/nodes/1", "out/ranks"] and "--network" in one["argv"]
    assert "@RUN@/out/nodes/1:/launcher/out" in one["argv"] and "@RUN@/out/ranks:/launcher/out/ranks" in one["argv"]
    assert not any("@NODE" in a for a in zero["argv"] + one["argv"]) and "10.0.0.5" in " ".join(one["argv"])


def test_a_runs_result_names_the_first_node_that_failed_and_every_node() -> None:
    ok = {"status": "succeeded", "exit_code": 0, "node": "10.0.0.5", "node_id": "a", "task_id": "t0"}
    dead = {"status": "failed", "exit_code": 137, "node": "10.0.0.6", "node_id": "b", "error": "exited 137"}
    stopped = {"status": "cancelled", "exit_code": 143, "node": "10.0.0.5", "node_id": "a"}
    assert ray_job.merge(1, [(0, dead)]) == dead
    merged = ray_job.merge(2, [(1, dead), (0, stopped)])
    assert (merged["status"], merged["exit_code"], merged["error"]) == ("failed", 137, "node 1: exited 137")
    assert merged["nodes"] == ["10.0.0.5", "10.0.0.6"] and merged["node_id"] == "a"
    assert ray_job.merge(2, [(0, ok), (1, {**ok, "node": "10.0.0.6"})])["status"] == "succeeded"
    assert ray_job.merge(2, [(0, stopped), (1, {**stopped, "node": "10.0.0.6"})])["status"] == "cancelled"


def test_states_come_from_task_json_else_from_the_ray_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = LocalHost(tmp_path)
    run_dir = Path(host.run_dir("r1"))
    run_dir.mkdir(parents=True)
    placement = RayPlacement(host)
    placement.python = "python3"
    answers = {"status": {"status": "RUNNING"}}
    monkeypatch.setattr(ray_target, "call", lambda _h, _p, cmd, *a, **k: answers[cmd])
    monkeypatch.setattr(ray_target, "STATUS_TTL_S", -1.0)  # every state asks (a group's replicates share answers)
    launch: Any = {"run_id": "r1", "ray": {"job_id": "launcher-r1", "index": 0, "array_size": 1,
                                           "array_dir": host.area("ray", "r1"), "run_dir": str(run_dir)}}
    state = placement.state(launch)
    assert state is not None and state.running and not state.ended
    answers["status"] = {"status": "STOPPED", "message": "Job was intentionally stopped.\n"}
    (run_dir / "placed.json").write_text(json.dumps({"node_id": "n1", "node": "10.0.0.2", "task_id": "t1"}))
    state = placement.state(launch)
    assert state is not None and state.ended and state.status == "cancelled" and state.info is not None
    assert state.info["node_id"] == "n1" and "ended STOPPED" in str(state.info["error"])
    (run_dir / "task.json").write_text(json.dumps({"exit_code": 137, "status": "failed", "node": "10.0.0.2",
                                                   "node_id": "n1", "task_id": "t1", "image_ran": "sha256:x",
                                                   "error": "the container exited 137 (killed by signal 9)"}))
    state = placement.state(launch)
    assert state is not None and (state.exit_code, state.status, state.image_ran) == (137, "failed", "sha256:x")
    assert state.info is not None and state.info["kind"] == "ray" and "signal 9" in str(state.info["error"])
    launch["ray"] = {"job_id": "launcher-r1"}
    with pytest.raises(Exception, match="without index, array_dir, run_dir"):
        placement.state(launch)


def test_the_ray_target_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    run = ["run", "mnist_convnet", "--host", "head.invalid", "--scheduler", "ray"]  # no host is reached
    res = runner.invoke(app, [*run, "--partition", "gpu"])
    assert res.exit_code == ExitCode.USAGE and "--partition is a Slurm option" in res.output
    res = runner.invoke(app, [*run, "--ray-opt", "cpus=2"])
    assert res.exit_code == ExitCode.USAGE and "not a task resource" in res.output
    res = runner.invoke(app, ["provision", "--host", "head.invalid", "--ray-address", "http://127.0.0.1:8265"])
    assert res.exit_code == ExitCode.USAGE and "are cluster settings" in res.output


def test_a_hand_made_launch_record_names_no_other_folder_on_the_head(tmp_path: Path) -> None:
    """A cloned workspace's launch.json is someone else's file: `stop` writes its cancel file only into a group's
    folder launcher makes, and state reads task.json only from the run's own folder."""
    from launcher.errors import Corrupt

    host = LocalHost(tmp_path)
    placement = RayPlacement(host)
    victim = tmp_path / "victim"
    victim.mkdir()
    good = {"job_id": "launcher-r1", "index": 0, "array_size": 1, "array_dir": host.area("ray", "r1"),
            "run_dir": host.run_dir("r1")}
    for bad in ({"array_dir": str(victim)}, {"array_dir": host.area("ray", "..")}, {"run_dir": str(victim)},
                {"job_id": "launcher-other"}, {"run_dir": host.run_dir("r2")}):
        launch: Any = {"run_id": "r1", "ray": {**good, **bad}}
        with pytest.raises(Corrupt, match="launcher does not make"):
            placement.stop(launch)
        with pytest.raises(Corrupt, match="launcher does not make"):
            placement.state(launch)
    assert list(victim.iterdir()) == []


class _Head:
    """A head that answers find_python's two questions: the `ray` command's first line, and which Python has Ray."""

    name = "head"

    def __init__(self, shebang: str, with_ray: set[str]) -> None:
        self.shebang, self.with_ray, self.asked = shebang, with_ray, []

    def run(self, argv: list[str], check: bool = False, timeout: float | None = None) -> Any:
        from launcher.proc import Completed

        if argv[0] == "sh":
            return Completed(tuple(argv), 0, self.shebang.encode(), b"")
        self.asked.append(argv[0])
        ok = argv[0] in self.with_ray
        return Completed(tuple(argv), 0 if ok else 1, b"2.60.0\n" if ok else b"", b"" if ok else b"No module 'ray'")


def test_the_heads_python_is_the_one_its_ray_command_runs() -> None:
    from launcher.errors import NoScheduler
    from launcher.targets.ray import find_python

    head: Any = _Head("/opt/venv/bin/python3.11", {"/opt/venv/bin/python3.11"})
    assert find_python(head, {}) == ("/opt/venv/bin/python3.11", "2.60.0")
    head = _Head("/usr/bin/env -S python3", {"python3"})
    assert find_python(head, {}) == ("python3", "2.60.0") and head.asked == ["python3"]
    head = _Head("", {"/srv/ray/bin/python"})
    assert find_python(head, {"python": "/srv/ray/bin/python"})[0] == "/srv/ray/bin/python"
    with pytest.raises(NoScheduler, match="has no Ray with its job API"):
        find_python(_Head("", set()), {})


def test_provision_keeps_the_address_and_a_registry_every_node_reaches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    from launcher.errors import RegistryUnavailable
    from launcher.targets import ray_target
    from launcher.targets.registry import ProvisionRequest

    host = LocalHost(tmp_path)
    reach = {"10.0.0.5": True, "10.0.0.6": True}
    seen: list[Any] = []

    def facts(head: Any, settings: Any, registry: str | None) -> dict[str, Any]:
        seen.append((dict(settings), registry))
        return {"ray_version": "2.60.0", "python": "/usr/bin/python3", "address": settings.get("address"),
                "nodes": [{"node_id": a, "address": a, "docker": "24.0", "reaches_registry": r}
                          for a, r in reach.items()]}

    monkeypatch.setattr(ray_target, "cluster_facts", facts)
    opened = lambda: contextlib.nullcontext(host)  # noqa: E731
    done = ray_target.provision(opened, ProvisionRequest(address="http://10.0.0.5:8265", registry="10.0.0.9:5000"))
    assert "2 nodes alive, 2 with a usable Docker engine" in done.summary
    kept = json.loads(Path(host.area("ray.json")).read_text())
    assert kept == {"address": "http://10.0.0.5:8265", "python": "/usr/bin/python3", "registry": "10.0.0.9:5000"}
    reach["10.0.0.6"] = False
    with pytest.raises(RegistryUnavailable, match=r"10\.0\.0\.6 cannot reach registry 10\.0\.0\.8:5000"):
        ray_target.provision(opened, ProvisionRequest(registry="10.0.0.8:5000"))
    assert json.loads(Path(host.area("ray.json")).read_text()) == kept  # nothing was changed
    ray_target.provision(opened, ProvisionRequest(registry="none"))
    assert "registry" not in json.loads(Path(host.area("ray.json")).read_text())
    assert seen[1] == (kept, "10.0.0.8:5000")  # the probe used the kept address, and the registry asked about
    with pytest.raises(UsageError, match="not Ray cluster settings"):
        ray_target.provision(opened, ProvisionRequest(install=True))
    with pytest.raises(UsageError, match="is not the job API's URL"):
        ray_target.provision(opened, ProvisionRequest(address="127.0.0.1:8265"))


def test_the_replicates_of_a_group_share_one_question_to_the_job_api(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = LocalHost(tmp_path)
    placement = RayPlacement(host)
    placement.python = "python3"
    asked: list[str] = []
    monkeypatch.setattr(ray_target, "call", lambda _h, _p, cmd, *a, **k: asked.append(cmd) or {"status": "RUNNING"})
    for run_id in ("r1", "r2", "r3"):  # three replicates of one Ray job, still running
        Path(host.run_dir(run_id)).mkdir(parents=True)
        launch: Any = {"run_id": run_id, "ray": {"job_id": "launcher-r1", "index": 0, "array_size": 3,
                                                 "array_dir": host.area("ray", "r1"), "run_dir": host.run_dir(run_id)}}
        state = placement.state(launch)
        assert state is not None and state.running
    assert asked == ["status"]


def test_without_an_archive_the_head_saves_the_image_its_engine_holds_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head, _run_dir = _head(tmp_path)
    os.unlink(head.runs["r1"]["image_archive"])  # launcher found the image in the head's engine and sent none
    head.runs["r1"]["image_id"] = "sha256:" + "ab" * 32
    with pytest.raises(RuntimeError, match="its engine cannot save it"):  # no docker here
        head.open("r1", "image")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "docker").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nprintf "saved %s" "$4" > "$3"\n')
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    for _ in range(2):
        token, sha, size = head.open("r1", "image")
        saved = head.read(token, 0, size)
        assert saved == b"saved sha256:" + b"ab" * 32 and sha == hashlib.sha256(saved).hexdigest()
    assert calls.read_text().count("save -o") == 1
    head.cleanup()


def test_provision_prints_the_ray_clusters_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    from launcher.cli.provision_text import cluster_text
    from launcher.result import Result

    facts = {"ray_version": "2.60.0", "address": "http://127.0.0.1:8265", "python": "/usr/bin/python3",
             "registry": "10.0.0.9:5000", "settings": {"registry": "10.0.0.9:5000"},
             "nodes": [{"node_id": "67a0fe3b327f91d6", "address": "10.0.0.5", "head": True, "cpus": 2.0, "gpus": 0,
                        "memory_mb": 2048, "docker": "24.0.7", "nvidia_runtime": False, "reaches_registry": True},
                       {"node_id": "fe05573bfbe4aa", "address": "10.0.0.6", "head": False, "cpus": 8.0, "gpus": 1.0,
                        "memory_mb": None, "docker": None, "probe_error": "GetTimeoutError: no answer",
                        "reaches_registry": False}]}
    cluster_text(Result("provision", {"host": "head", "ray": facts}, summary="Ray 2.60.0: 2 nodes alive"))
    out = capsys.readouterr().out
    assert "Ray 2.60.0 at head (job API http://127.0.0.1:8265, Python /usr/bin/python3)" in out
    assert "67a0fe3b*" in out and "10.0.0.6" in out and "(* the head node)" in out  # whole at 80 columns
    assert "node fe05573b (10.0.0.6): its probe failed: GetTimeoutError: no answer" in out
    assert "pushed to 10.0.0.9:5000, pulled by digest on each node" in out


def test_with_a_registry_set_a_group_pushes_once_and_its_tasks_pull_by_digest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.transfers import ship

    placement = RayPlacement(LocalHost(tmp_path))
    placement.settings = {"registry": "10.0.0.5:5000"}
    pushed: list[str] = []
    digest = "sha256:" + "cd" * 32
    monkeypatch.setattr(ship, "push_to_registry", lambda image_id, registry: pushed.append(registry) or digest)
    image: Any = {"id": "sha256:" + "ab" * 32}
    first = placement.ship(image, via=None, reporter=None, cache_dir=tmp_path)
    again = placement.ship(image, via=None, reporter=None, cache_dir=tmp_path)  # the group's next replicate
    assert (first.skipped, again.skipped, pushed) == (False, True, ["10.0.0.5:5000"])
    assert placement.image_source == {"kind": "registry", "registry": "10.0.0.5:5000", "image_id": image["id"],
                                      "ref": f"10.0.0.5:5000/{ship.SHIP_REPO}@{digest}"}
    archive = Path(placement.image_archive(image["id"]))  # --ship-via head: the archive there already is used
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"an image")
    assert placement.ship(image, via="head", reporter=None, cache_dir=tmp_path).skipped
    assert placement.image_source == {"kind": "head"} and pushed == ["10.0.0.5:5000"]
