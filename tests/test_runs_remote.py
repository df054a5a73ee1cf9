"""`launcher run` and friends against the real SSH test host and the local engine (tiny image)."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest_testhost import make_workspace
from testhost import TestHost
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode, HostUnreachable, LauncherError
from launcher.hosts import engine
from launcher.hosts.hostspec import HostSpec
from launcher.hosts.ssh import SSHHost
from launcher.workspace import Workspace

pytestmark = pytest.mark.testhost


def ssh_args(th: TestHost) -> list[str]:
    return [
        "--host",
        th.spec,
        "--identity",
        str(th.key),
        "--known-hosts",
        str(th.known_hosts),
        "--ssh-config",
        "/dev/null",
    ]


def cli(ws: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(app, ["--workspace", str(ws), "--json", "--quiet", *args])
    out = result.stdout
    if result.exit_code != 0 and not out.strip():
        # the error envelope on stdout is the shared CLI layer's job; the one-line error is on stderr
        return result.exit_code, {"summary": result.stderr, "exit_code": result.exit_code}, result.stderr
    try:
        data = json.loads(out)
    except ValueError:
        raise AssertionError(f"not JSON (exit {result.exit_code}): {out!r} {result.stderr!r}") from None
    return result.exit_code, data, result.stderr


def complete_runs(ws: Path) -> list[Path]:
    return sorted(ws.glob("runs/*/manifest.json"))


def test_run_ships_trains_and_pulls_what_the_host_hashed(
    testhost: TestHost, tiny_workspace: Path, tiny_image: dict[str, Any]
) -> None:
    testhost.exec("docker", "rmi", "-f", tiny_image["id"], check=False)
    code, env, err = cli(
        tiny_workspace,
        "run",
        "tiny",
        *ssh_args(testhost),
        "--seed",
        "7",
        "--param",
        "size_kb=256",
        "--threads",
        "3",
    )
    assert code == 0, err
    manifest = env["data"]["runs"][0]
    run_dir = tiny_workspace / "runs" / manifest["run_id"]
    assert json.loads((run_dir / "manifest.json").read_text()) == manifest
    launch = json.loads((run_dir / "launch.json").read_text())
    # shipped; layers another image on the host already holds are sent as empty files
    assert launch["ship"]["skipped"] is False
    n_layers = len(engine.local().inspect_image(tiny_image["id"])["RootFS"]["Layers"])
    assert launch["ship"]["layers_sent"] + launch["ship"]["layers_skipped"] == n_layers
    assert manifest["status"] == "succeeded" and manifest["exit_code"] == 0
    assert manifest["image"]["id"] == tiny_image["id"] and manifest["seed"] == 7
    assert manifest["params"] == {"size_kb": 256}
    assert manifest["host"]["kind"] == "ssh" and manifest["host"]["facts"]["docker"]["usable"] is True
    assert manifest["host"]["facts"]["cpu_cores"] >= 1 and manifest["host"]["facts"]["ram_bytes"] > 0
    injected = manifest["determinism"]["env"]
    assert injected["LAUNCHER_SEED"] == "7" and injected["PYTHONHASHSEED"] == "7"
    assert injected["TF_NUM_INTRAOP_THREADS"] == "3" and manifest["determinism"]["threads"] == 3
    seen = json.loads((run_dir / "outputs" / "env.json").read_text())
    assert {k: v for k, v in injected.items() if k in seen} == {k: seen[k] for k in injected if k in seen}
    assert manifest["runtime"], "runtime.json from the container is in the manifest"

    remote_out = f"/root/.launcher/runs/{manifest['run_id']}/out"
    listing = testhost.exec("sh", "-c", f"cd {remote_out} && find . -type f -print0 | xargs -0 sha256sum")
    host_digests = {
        "outputs/" + line[66:].removeprefix("./"): "sha256:" + line[:64] for line in listing.splitlines()
    }
    assert {a["path"]: a["sha256"] for a in manifest["artifacts"]} == host_digests
    assert "outputs/model/weights.bin" in host_digests

    code, env2, err = cli(
        tiny_workspace,
        "run",
        "tiny",
        *ssh_args(testhost),
        "--seed",
        "7",
        "--param",
        "size_kb=256",
        "--threads",
        "3",
    )
    assert code == 0, err
    second = env2["data"]["runs"][0]
    launch2 = json.loads((tiny_workspace / "runs" / second["run_id"] / "launch.json").read_text())
    assert launch2["ship"]["skipped"] is True
    by_path = {a["path"]: a["sha256"] for a in second["artifacts"]}
    assert by_path["outputs/model/weights.bin"] == host_digests["outputs/model/weights.bin"]

    code, ps, _ = cli(tiny_workspace, "ps")
    assert {r["run_id"] for r in ps["data"]["runs"]} == {manifest["run_id"], second["run_id"]}
    assert {r["status"] for r in ps["data"]["runs"]} == {"succeeded"}
    code, logs, _ = cli(tiny_workspace, "logs", manifest["run_id"])
    assert code == 0 and any(line.startswith("tiny: done") for line in logs["data"]["lines"])


def test_runs_and_seeds_make_one_group(testhost: TestHost, tiny_workspace: Path) -> None:
    code, env, err = cli(tiny_workspace, "run", "tiny", *ssh_args(testhost), "--runs", "2", "--seed", "1")
    assert code == 0, err
    runs = env["data"]["runs"]
    assert [r["replicate"] for r in runs] == [0, 1] and {r["group"] for r in runs} == {env["data"]["group"]}
    digests = [{a["path"]: a["sha256"] for a in r["artifacts"]}["outputs/model/weights.bin"] for r in runs]
    assert digests[0] == digests[1]
    code, env, err = cli(tiny_workspace, "run", "tiny", *ssh_args(testhost), "--seed", "1", "--seed", "2")
    assert code == 0, err
    assert [r["seed"] for r in env["data"]["runs"]] == [1, 2]


def test_a_failing_recipe_gives_a_manifest_with_its_exit_code_and_logs(
    testhost: TestHost, tiny_workspace: Path
) -> None:
    code, env, err = cli(tiny_workspace, "run", "crash", *ssh_args(testhost))
    assert code == ExitCode.RUN_FAILED, err
    manifest = env["data"]["runs"][0]
    assert manifest["status"] == "failed" and manifest["exit_code"] == 3
    log = (tiny_workspace / "runs" / manifest["run_id"] / "outputs" / "logs" / "train.log").read_text()
    assert "crash: about to fail" in log and "crash: this goes to stderr" in log
    assert "outputs/logs/train.log" in {a["path"] for a in manifest["artifacts"]}
    assert "failed" in env["summary"]


def test_symlink_output_is_refused_and_nothing_leaves_runs(testhost: TestHost, tiny_workspace: Path) -> None:
    before = {
        p
        for p in tiny_workspace.parent.rglob("*")
        if "runs" not in p.relative_to(tiny_workspace.parent).parts
    }
    code, env, err = cli(tiny_workspace, "run", "evil", *ssh_args(testhost))
    assert code == ExitCode.UNSAFE_PATH, err
    assert "passwd" in env["summary"] and "symlink" in env["summary"]
    assert complete_runs(tiny_workspace) == []
    after = {
        p
        for p in tiny_workspace.parent.rglob("*")
        if "runs" not in p.relative_to(tiny_workspace.parent).parts
    }
    new_outside = {p.relative_to(tiny_workspace).as_posix() for p in after - before}
    assert all(p.startswith(".launcher/hosts") for p in new_outside), new_outside
    pulled = [p.name for p in (tiny_workspace / "runs").rglob("*") if p.is_file() or p.is_symlink()]
    assert "passwd" not in pulled and "ok.txt" in pulled


def test_cut_connection_leaves_the_run_going_and_pull_gets_everything(
    testhost: TestHost, tiny_workspace: Path
) -> None:
    from launcher.runs import lifecycle as runs

    ws = Workspace.at(tiny_workspace)
    opts = {"identity": testhost.key, "known_hosts": testhost.known_hosts, "ssh_config": Path("/dev/null")}
    host = SSHHost.connect(testhost.spec, **opts)  # type: ignore[arg-type]
    spec = runs.RunRequest("tiny", params={"sleep": 6.0, "size_kb": 128})
    failure: list[BaseException] = []

    def attached() -> None:
        try:
            runs.run_recipe(
                ws, spec, host, host_spec=HostSpec(testhost.spec, **opts), on_log=lambda _: None
            )
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=attached)
    worker.start()
    deadline = time.monotonic() + 60  # only so that a run that never starts fails instead of hanging
    while "launcher-" not in testhost.exec("docker", "ps", "--format", "{{.Names}} {{.Status}}"):
        assert worker.is_alive(), f"the run ended before its container was seen: {failure}"
        assert time.monotonic() < deadline, "hung: no launcher container on the test host after 60 s"
        time.sleep(0.2)
    run_id = next((tiny_workspace / "runs").iterdir()).name
    transport = host._client.get_transport()
    assert transport is not None
    transport.sock.shutdown(socket.SHUT_RDWR)  # the network goes away under the client
    worker.join(60)
    assert not worker.is_alive()
    assert failure and isinstance(failure[0], HostUnreachable | LauncherError), failure
    assert f"launcher-{run_id}" in testhost.exec("docker", "ps", "--format", "{{.Names}}")
    assert complete_runs(tiny_workspace) == []

    code, env, err = cli(tiny_workspace, "pull", run_id, "--watch", "1")
    assert code == 0, err
    manifest = env["data"]["run"]
    assert manifest["status"] == "succeeded"
    remote_out = f"/root/.launcher/runs/{run_id}/out"
    listing = testhost.exec("sh", "-c", f"cd {remote_out} && find . -type f -print0 | xargs -0 sha256sum")
    assert {a["path"]: a["sha256"] for a in manifest["artifacts"]} == {
        "outputs/" + line[66:].removeprefix("./"): "sha256:" + line[:64] for line in listing.splitlines()
    }
    code, again, _ = cli(tiny_workspace, "pull", run_id)
    assert code == 0 and again["data"]["run"]["artifacts"] == manifest["artifacts"]


def test_detach_then_attach(testhost: TestHost, tiny_workspace: Path) -> None:
    code, env, err = cli(tiny_workspace, "run", "tiny", *ssh_args(testhost), "--detach", "--param", "sleep=2")
    assert code == 0, err
    run_id = env["data"]["runs"][0]["run_id"]
    assert complete_runs(tiny_workspace) == []
    code, env, err = cli(tiny_workspace, "pull", run_id)
    assert code == 0 and env["data"]["run"]["status"] in ("running", "succeeded")
    code, env, err = cli(tiny_workspace, "attach", run_id)
    assert code == 0, err
    assert env["data"]["manifest"]["status"] == "succeeded"
    assert any("tiny: done" in line for line in env["data"]["lines"])


def test_stop_a_detached_run(testhost: TestHost, tiny_workspace: Path) -> None:
    code, env, err = cli(
        tiny_workspace, "run", "tiny", *ssh_args(testhost), "--detach", "--param", "sleep=60"
    )
    assert code == 0, err
    run_id = env["data"]["runs"][0]["run_id"]
    time.sleep(1)
    code, env, err = cli(tiny_workspace, "stop", run_id)
    assert code == 0, err
    assert env["data"]["stopped"] is True
    # stopped, not waited for: the 60 s sleep did not finish
    code, env, _ = cli(tiny_workspace, "pull", run_id)
    assert code == ExitCode.RUN_FAILED
    assert env["data"]["run"]["status"] == "failed" and env["data"]["run"]["exit_code"] != 0


def test_the_same_run_without_host_uses_the_local_engine(tiny_workspace: Path) -> None:
    code, env, err = cli(tiny_workspace, "run", "tiny", "--seed", "7", "--param", "size_kb=16")
    assert code == 0, err
    manifest = env["data"]["runs"][0]
    assert manifest["host"]["kind"] == "local" and manifest["status"] == "succeeded"
    host_out = tiny_workspace / ".launcher" / "host-runs" / manifest["run_id"] / "out"
    import hashlib

    for a in manifest["artifacts"]:
        rel = a["path"].removeprefix("outputs/")
        assert a["sha256"] == "sha256:" + hashlib.sha256((host_out / rel).read_bytes()).hexdigest()

    data = tiny_workspace.parent / "local-data"
    data.mkdir()
    (data / "x.txt").write_text("local\n")
    code, env, err = cli(tiny_workspace, "run", "tiny", "--data-from", str(data), "--param", "size_kb=1")
    assert code == 0, err
    run = env["data"]["runs"][0]
    assert run["data_source"]["sent"] is False and run["data"] == str(data.resolve())  # mounted where it is
    seen = json.loads((tiny_workspace / "runs" / run["run_id"] / "outputs" / "data.json").read_text())
    assert seen == {"x.txt": hashlib.sha256(b"local\n").hexdigest()}


def one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


def test_bad_inputs_are_one_line_errors_with_distinct_codes(
    testhost: TestHost, tiny_workspace: Path, tiny_image: dict[str, Any]
) -> None:
    ws = tiny_workspace
    cases: list[tuple[list[str], ExitCode, str]] = [
        (["run", "nosuch", *ssh_args(testhost)], ExitCode.NOT_FOUND, "unknown recipe"),
        (["run", "tiny", "--param", "oops", *ssh_args(testhost)], ExitCode.USAGE, "param 'oops'"),
        (["run", "tiny", "--param", "nope=1", *ssh_args(testhost)], ExitCode.USAGE, "no param 'nope'"),
        (["run", "tiny", *ssh_args(testhost), "--port", "2"], ExitCode.CONNECTION_REFUSED, "refused the connection"),
        (
            [
                "run",
                "tiny",
                "--host",
                testhost.spec,
                "--identity",
                str(testhost.key),
                "--ssh-config",
                "/dev/null",
                "--known-hosts",
                str(ws / "empty_known_hosts"),
            ],
            ExitCode.HOST_KEY_REJECTED,
            "SHA256:",
        ),
    ]
    make_workspace(ws, tiny_image, variant="gpu")
    cases.append((["run", "tiny", "--variant", "gpu", *ssh_args(testhost)], ExitCode.NO_GPU, "GPU"))
    for args, expected, text in cases:
        code, env, err = cli(ws, *args)
        assert code == expected, (args, err)
        assert text in one_line_error(err) and env["exit_code"] == expected
        assert env["ok"] is False and text in env["summary"]  # the --json error envelope
    assert not (ws / "runs").exists()

    testhost.exec("mv", "/usr/bin/docker", "/usr/bin/docker.off")
    try:
        code, env, err = cli(ws, "run", "tiny", *ssh_args(testhost))
    finally:
        testhost.exec("mv", "/usr/bin/docker.off", "/usr/bin/docker")
    assert code == ExitCode.HOST_NOT_READY and "Docker is not installed" in one_line_error(err)

    testhost.exec("mkdir", "-p", "/root/.launcher/runs")
    testhost.exec("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/root/.launcher/runs")
    try:
        code, env, err = cli(ws, "run", "tiny", *ssh_args(testhost))
    finally:
        testhost.exec("umount", "/root/.launcher/runs")
    assert code == ExitCode.DISK_FULL and "free" in one_line_error(err)
    assert not (ws / "runs").exists()


def test_a_plain_script_runs_with_the_profile_injected(testhost: TestHost, tiny_workspace: Path) -> None:
    script = tiny_workspace.parent / "my train.py"
    script.write_text(
        "import os, sys\nprint('seed', os.environ['LAUNCHER_SEED'], 'hash', os.environ['PYTHONHASHSEED'])\n"
        "open(os.path.join(os.environ['LAUNCHER_OUT'], 'done.txt'), 'w').write('ok')\n"
    )
    code, env, err = cli(tiny_workspace, "run", str(script), "--seed", "11", *ssh_args(testhost), "--detach")
    assert code == 0, err
    run_id = env["data"]["runs"][0]["run_id"]
    assert "_my_train.py-" in run_id  # named by its project (the script's folder) and its path
    code, ps, err = cli(tiny_workspace, "ps", *ssh_args(testhost))
    assert code == 0, err
    row = next(r for r in ps["data"]["runs"] if r["run_id"] == run_id)
    assert row["container"] in ("running", "exited")
    code, env, err = cli(tiny_workspace, "attach", run_id)
    assert code == 0, err
    manifest = env["data"]["manifest"]
    assert manifest["recipe"]["name"] == "my train" and manifest["seed"] == 11
    assert manifest["recipe"]["identity"] == f"{script.parent.name}/my train.py"
    assert "outputs/done.txt" in {a["path"] for a in manifest["artifacts"]}
    log = (tiny_workspace / "runs" / run_id / "outputs" / "logs" / "train.log").read_text()
    assert "seed 11 hash 11" in log


def test_a_network_black_hole_ends_the_wait_and_a_later_pull_gets_everything(
    testhost: TestHost, tiny_workspace: Path
) -> None:
    from launcher.runs.collect import wait_run

    code, env, err = cli(
        tiny_workspace, "run", "tiny", *ssh_args(testhost), "--detach", "--param", "sleep=12"
    )
    assert code == 0, err
    run_id = env["data"]["runs"][0]["run_id"]
    host = SSHHost.connect(
        testhost.spec,
        identity=testhost.key,
        known_hosts=testhost.known_hosts,
        ssh_config=Path("/dev/null"),
        keepalive_s=1,
        dead_peer_s=3,
    )
    failure: list[BaseException] = []

    def follow() -> None:
        try:
            wait_run(Workspace.at(tiny_workspace), run_id, host, on_log=lambda _: None)
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=follow)
    worker.start()
    time.sleep(1)
    rule = ["INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP"]
    testhost.exec("iptables", "-I", *rule)  # packets now vanish: no reset, no FIN
    try:
        worker.join(40)  # dead_peer_s=3: a bound against hanging, not a speed requirement
        assert not worker.is_alive(), "hung: the client still waits on a dead connection after 40 s"
        assert failure and isinstance(failure[0], HostUnreachable | LauncherError), failure
        assert f"launcher-{run_id}" in testhost.exec("docker", "ps", "--format", "{{.Names}}")
    finally:
        testhost.exec("iptables", "-D", *rule)
        host.close()
    code, env, err = cli(tiny_workspace, "pull", run_id, "--watch", "1")
    assert code == 0, err
    assert env["data"]["run"]["status"] == "succeeded" and complete_runs(tiny_workspace)


def test_a_user_who_is_not_root_owns_the_outputs_the_root_container_wrote(
    testhost: TestHost, tiny_workspace: Path
) -> None:
    testhost.exec(
        "sh",
        "-c",
        "id alice >/dev/null 2>&1 || useradd -m -s /bin/sh -G docker alice; "
        "mkdir -p /home/alice/.ssh && cp /root/.ssh/authorized_keys /home/alice/.ssh/ && "
        "chown -R alice:alice /home/alice/.ssh && chmod 700 /home/alice/.ssh",
    )
    args = ssh_args(testhost)
    args[args.index("--host") + 1] = f"alice@{testhost.ip}"
    code, env, err = cli(tiny_workspace, "run", "tiny", *args, "--param", "size_kb=16")
    assert code == 0, err
    run_id = env["data"]["runs"][0]["run_id"]
    assert env["data"]["runs"][0]["status"] == "succeeded"
    owners = testhost.exec(
        "sh", "-c", f"find /home/alice/.launcher/runs/{run_id} -printf '%u %p\\n'"
    ).splitlines()
    assert len(owners) > 5 and any("/out/model/" in line for line in owners)
    assert [line for line in owners if not line.startswith("alice ")] == []
    # and alice can clean up after herself, with no sudo
    testhost.exec("su", "alice", "-c", f"rm -r /home/alice/.launcher/runs/{run_id}")


def test_data_from_sends_a_local_dataset_once_by_content(testhost: TestHost, tiny_workspace: Path) -> None:
    import hashlib

    data = tiny_workspace.parent / "dataset"
    (data / "train").mkdir(parents=True)
    (data / "train" / "a.bin").write_bytes(b"a" * 300_000)
    (data / "labels.csv").write_text("x,y\n1,2\n")
    want = {
        "labels.csv": hashlib.sha256(b"x,y\n1,2\n").hexdigest(),
        "train/a.bin": hashlib.sha256(b"a" * 300_000).hexdigest(),
    }

    # the test host is shared: datasets other tests sent are there already, and stay
    before = set(testhost.exec("sh", "-c", "ls -A /root/.launcher/data 2>/dev/null || true").split())
    code, env, err = cli(tiny_workspace, "run", "tiny", *ssh_args(testhost), "--data-from", str(data))
    assert code == 0, err
    first = env["data"]["runs"][0]
    source = first["data_source"]
    assert source["kind"] == "sent" and source["sent"] is True and source["files"] == 2
    assert source["path"] == f"/root/.launcher/data/{source['digest'][7:]}" == first["data"]
    run_dir = tiny_workspace / "runs" / first["run_id"]
    assert json.loads((run_dir / "outputs" / "data.json").read_text()) == want
    # what the host holds is complete and nothing temporary is left beside it
    assert set(testhost.exec("ls", "-A", "/root/.launcher/data").split()) - before == {source["digest"][7:]}

    code, env, err = cli(tiny_workspace, "run", "tiny", *ssh_args(testhost), "--data-from", str(data))
    assert code == 0, err
    again = env["data"]["runs"][0]["data_source"]
    assert again["sent"] is False and again["digest"] == source["digest"]

    (data / "labels.csv").write_text("x,y\n1,3\n")  # another content: another folder
    code, env, err = cli(tiny_workspace, "run", "tiny", *ssh_args(testhost), "--data-from", str(data))
    assert code == 0, err
    changed = env["data"]["runs"][0]["data_source"]
    assert changed["sent"] is True and changed["digest"] != source["digest"]


def test_data_from_bad_input(testhost: TestHost, tiny_workspace: Path) -> None:
    missing = tiny_workspace.parent / "no-such-dataset"
    code, _, err = cli(tiny_workspace, "run", "tiny", *ssh_args(testhost), "--data-from", str(missing))
    assert code == ExitCode.BAD_DATA and "does not exist" in err and "Traceback" not in err
    linked = tiny_workspace.parent / "linked"
    linked.mkdir()
    (linked / "passwd").symlink_to("/etc/passwd")
    code, _, err = cli(tiny_workspace, "run", "tiny", *ssh_args(testhost), "--data-from", str(linked))
    assert code == ExitCode.BAD_DATA and "symlink" in err
    code, _, err = cli(
        tiny_workspace, "run", "tiny", *ssh_args(testhost), "--data-from", str(linked), "--data", "/tmp"
    )
    assert code == ExitCode.USAGE
    assert complete_runs(tiny_workspace) == []
    assert testhost.exec("sh", "-c", "ls -A /root/.launcher/data 2>/dev/null | grep partial || true") == ""


def test_clean_frees_the_host_only_once_the_local_copy_is_verified(testhost: TestHost, tiny_workspace: Path) -> None:
    code, env, err = cli(tiny_workspace, "run", "tiny", *ssh_args(testhost), "--param", "size_kb=8")
    assert code == 0, err
    done_id = env["data"]["runs"][0]["run_id"]
    code, env, err = cli(tiny_workspace, "run", "tiny", *ssh_args(testhost), "--detach", "--param", "sleep=60")
    assert code == 0, err
    going_id = env["data"]["runs"][0]["run_id"]
    on_host = "/root/.launcher/runs/{}".format

    # the local copy is altered: the host keeps its copy
    weights = tiny_workspace / "runs" / done_id / "outputs" / "model" / "weights.bin"
    good = weights.read_bytes()
    weights.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    code, _, err = cli(tiny_workspace, "clean", done_id)
    assert code == ExitCode.CORRUPT and "does not match its manifest" in err
    assert testhost.exec("test", "-d", on_host(done_id), check=False) == ""
    weights.write_bytes(good)

    code, env, err = cli(tiny_workspace, "clean", done_id)
    assert code == 0, err
    assert env["data"]["runs"][0]["removed"] is True
    assert testhost.exec("sh", "-c", f"test -e {on_host(done_id)} && echo left || echo gone").strip() == "gone"
    assert (tiny_workspace / "runs" / done_id / "manifest.json").is_file()  # the local copy stays
    code, env, err = cli(tiny_workspace, "clean", done_id)
    assert code == 0 and env["data"]["runs"][0]["removed"] is False

    # a run that is not pulled yet is refused; --force still will not delete a running one
    code, _, err = cli(tiny_workspace, "clean", going_id)
    assert code == ExitCode.NOT_FOUND and "not complete" in err
    code, _, err = cli(tiny_workspace, "clean", "--force", going_id)
    assert code == ExitCode.USAGE and "still running" in err
    assert testhost.exec("sh", "-c", f"test -d {on_host(going_id)} && echo kept").strip() == "kept"
    assert cli(tiny_workspace, "stop", going_id)[0] == 0
    code, env, err = cli(tiny_workspace, "clean", "--force", going_id)
    assert code == 0, err
    assert env["data"]["runs"][0]["removed"] and env["data"]["runs"][0]["container_removed"]
    assert testhost.exec("docker", "ps", "-aq", "--filter", f"name=launcher-{going_id}").strip() == ""


def test_clean_datasets_keeps_what_a_container_mounts(testhost: TestHost, tiny_workspace: Path) -> None:
    kept_dir, gone_dir = tiny_workspace.parent / "kept-data", tiny_workspace.parent / "gone-data"
    for d, text in ((kept_dir, "kept"), (gone_dir, "gone")):
        d.mkdir()
        (d / "f.txt").write_text(text * 1000)
    code, env, err = cli(tiny_workspace, "run", "tiny", *ssh_args(testhost), "--data-from", str(gone_dir))
    assert code == 0, err
    gone = env["data"]["runs"][0]["data_source"]["path"]
    code, _, err = cli(tiny_workspace, "clean", env["data"]["runs"][0]["run_id"])  # its container goes too
    assert code == 0, err
    code, env, err = cli(
        tiny_workspace, "run", "tiny", *ssh_args(testhost), "--data-from", str(kept_dir), "--detach",
        "--param", "sleep=30",
    )
    assert code == 0, err
    going = env["data"]["runs"][0]
    kept = going["data_source"]["path"]
    testhost.exec("mkdir", "-p", "/root/.launcher/data/.deadbeef.partial-old")
    testhost.exec("touch", "-d", "2 hours ago", "/root/.launcher/data/.deadbeef.partial-old")

    code, env, err = cli(tiny_workspace, "clean", "--datasets", "--dry-run", *ssh_args(testhost))
    assert code == 0, err
    would = {r["path"] for r in env["data"]["datasets"]["removed"]}
    assert {gone, "/root/.launcher/data/.deadbeef.partial-old"} <= would and kept not in would
    assert testhost.exec("sh", "-c", f"test -d {gone} && echo there").strip() == "there"

    code, env, err = cli(tiny_workspace, "clean", "--datasets", *ssh_args(testhost))
    assert code == 0, err
    left = testhost.exec("ls", "-A", "/root/.launcher/data").split()
    assert kept.rsplit("/", 1)[1] in left and gone.rsplit("/", 1)[1] not in left
    assert ".deadbeef.partial-old" not in left
    assert {k["path"] for k in env["data"]["datasets"]["kept"]} >= {kept}
    assert cli(tiny_workspace, "stop", going["run_id"])[0] == 0

    code, _, err = cli(tiny_workspace, "clean", "--datasets")
    assert code == ExitCode.USAGE and "--host" in err
    code, _, err = cli(tiny_workspace, "clean")
    assert code == ExitCode.USAGE and "nothing to clean" in err
