"""The Engine over a fake host: which inputs give which docker command lines (no engine needed)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from launcher.errors import EngineUnavailable, ExitCode, HostNotReady
from launcher.hosts.base import Host, HostProcess
from launcher.hosts.containerspec import ContainerSpec
from launcher.hosts.engine import Engine, chain_ids
from launcher.proc import Completed


class FakeHost(Host):
    """Answers each argv from a table (prefix -> (exit code, stdout, stderr)) and records it."""

    kind = "ssh"

    def __init__(self, answers: dict[tuple[str, ...], tuple[int, str, str]] | None = None) -> None:
        self.name = "fake"
        self.answers = answers or {}
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], *, input: bytes | None = None, check: bool = True,
            timeout: float | None = None) -> Completed:
        self.calls.append(list(argv))
        rc, out, err = next((a for p, a in self.answers.items() if tuple(argv[: len(p)]) == p), (0, "{}", ""))
        return Completed(tuple(argv), rc, out.encode(), err.encode())

    def start(self, argv: Sequence[str], *, bulk: bool = False, merge_stderr: bool = False) -> HostProcess:
        raise NotImplementedError

    def put_file(self, local: Path, remote: str) -> None:
        raise NotImplementedError

    def get_file(self, remote: str, local: Path) -> None:
        raise NotImplementedError

    def home(self) -> str:
        return "/home/fake"

    def runs_root(self) -> str:
        return "/home/fake/.launcher/runs"


def test_operations_build_these_command_lines() -> None:
    host = FakeHost()
    e = Engine(host)
    e.has_image("sha256:abc")
    e.tag("sha256:abc", "img:1")
    e.rmi("img:1")
    e.stop("c1")
    e.rm("c1")
    e.container_state("c1")
    e.ps_by_label("launcher.run", "{{.State}}")
    e.mount_sources(["a", "b"])
    e.mount_sources([])
    assert host.calls == [
        ["docker", "image", "inspect", "--format", "{{.Id}}", "sha256:abc"],
        ["docker", "tag", "sha256:abc", "img:1"],
        ["docker", "rmi", "img:1"],
        ["docker", "stop", "-t", "10", "c1"],
        ["docker", "rm", "c1"],
        ["docker", "inspect", "--format", "{{json .State}}", "c1"],
        ["docker", "ps", "-a", "--filter", "label=launcher.run", "--format", "{{.State}}"],
        ["docker", "inspect", "--format", "{{range .Mounts}}{{.Source}}\n{{end}}", "a", "b"],
    ]


def test_answers_are_parsed() -> None:
    diffs = ["sha256:" + "1" * 64, "sha256:" + "2" * 64]
    host = FakeHost({
        ("docker", "image", "ls"): (0, "sha256:b\nsha256:a\nsha256:a\n", ""),
        ("docker", "image", "inspect"): (0, '["' + '","'.join(diffs) + '"]\nnull\n', ""),
        ("docker", "inspect", "--format", "{{json .State}}"): (1, "", "No such object"),
        ("docker", "inspect", "--format", "{{.Image}}"): (0, "sha256:feed\n", ""),
        ("docker", "info", "--format", "{{json .SecurityOptions}}"): (0, '["name=seccomp","name=rootless"]', ""),
    })
    e = Engine(host)
    assert e.chain_ids() == set(chain_ids(diffs))
    assert host.calls[-1][-2:] == ["sha256:a", "sha256:b"]  # each image once
    assert e.container_state("gone") is None
    assert e.container_image("c1") == "sha256:feed"
    assert e.security_options() == ["name=seccomp", "name=rootless"]


def test_a_container_is_run_as_its_spec_says_and_nothing_else() -> None:
    host = FakeHost()
    Engine(host).run(ContainerSpec("img", ("python", "-V"), detach=True))
    assert host.calls == [["docker", "run", "-d", "img", "python", "-V"]]


@pytest.mark.parametrize(("answer", "words"), [
    ((127, "", "sh: docker: not found"), "not installed"),
    ((1, "", "permission denied while trying to connect"), "does not answer"),
])
def test_require_maps_a_missing_or_unusable_docker(answer: tuple[int, str, str], words: str) -> None:
    with pytest.raises(HostNotReady) as err:
        Engine(FakeHost({("docker", "version"): answer})).require()
    assert err.value.exit_code == ExitCode.HOST_NOT_READY and words in err.value.one_line()


def test_only_a_host_that_can_tunnel_offers_one() -> None:
    host = FakeHost()
    assert not host.can_reverse_tunnel()
    with pytest.raises(NotImplementedError):
        Engine(host).pull_through_tunnel("127.0.0.1:5001/x@sha256:1", 5001, "127.0.0.1:5000")


@pytest.mark.parametrize(("kind", "error"), [("local", EngineUnavailable), ("ssh", HostNotReady)])
def test_a_listing_without_an_answer_is_an_engine_error(kind: str, error: type[Exception]) -> None:
    host = FakeHost({("docker", "image", "ls"): (1, "", "Cannot connect to the Docker daemon")})
    host.kind = kind
    with pytest.raises(error, match="Cannot connect"):
        Engine(host).image_ids()


def test_an_ended_container_is_inspected_once_until_it_is_removed() -> None:
    from launcher.targets.placement import DirectPlacement

    ended = '{"Running": false, "Status": "exited", "ExitCode": 3, "FinishedAt": "t1"}'
    host = FakeHost({("docker", "inspect"): (0, ended, "")})
    placement, launch = DirectPlacement(host), {"run_id": "r1", "container": "c1"}
    inspects = lambda: sum(c[:2] == ["docker", "inspect"] for c in host.calls)  # noqa: E731
    first = placement.state(launch)
    assert first is not None and first.ended and first.exit_code == 3
    assert placement.state(launch) == first and inspects() == 1  # an ended state does not change
    placement.release(launch)
    assert placement.state(launch) == first and inspects() == 2  # removed (or started again): asked afresh
    host.answers = {("docker", "inspect"): (0, '{"Running": true, "Status": "running"}', "")}
    placement.release(launch)
    assert placement.state(launch) is not None and placement.state(launch).running  # type: ignore[union-attr]
    assert inspects() == 4  # a running container is asked each time


def test_a_container_started_by_image_id_records_that_id_without_asking(tmp_path: Path) -> None:
    from launcher.runtime.recipespec import RecipeSpec
    from launcher.specs.container import ContainerJob
    from launcher.specs.recipes import Recipe
    from launcher.targets.placement import DirectPlacement

    recipe = Recipe(RecipeSpec(tmp_path / "tiny", "tiny", "none", "train.py"), "sha256:" + "0" * 64)
    image = "sha256:" + "a" * 64
    job = ContainerJob(run_id="20260101T000000-tiny-abcdef", image_id=image, env={}, host_out=str(tmp_path / "out"),
                       recipe=recipe, params={})
    host = FakeHost({("docker", "inspect", "--format", "{{.Image}}"): (0, "sha256:" + "b" * 64 + "\n", "")})
    record = DirectPlacement(host).start(job)
    assert record["image_ran"] == image and record["container_spec"]["image"] == image
    assert not any(c[:2] == ["docker", "inspect"] for c in host.calls)  # a full ID is the image that runs
    DirectPlacement(host).start(replace(job, image_id="tiny:latest"))  # a name: the engine says what it was
    assert host.calls[-1][:4] == ["docker", "inspect", "--format", "{{.Image}}"]


def test_in_a_kept_block_the_local_engine_reads_an_image_once_for_its_check_and_its_inspect() -> None:
    from launcher import memo

    info = '{"Id": "sha256:abc", "RepoTags": ["img:1"], "Size": 5}'
    host = FakeHost({("docker", "image", "inspect"): (0, info, "")})
    host.kind = "local"
    e = Engine(host)
    assert e.holds_image("sha256:abc") and e.inspect_image("sha256:abc")["RepoTags"] == ["img:1"]
    assert len(host.calls) == 2 and host.calls[0][-2] == "{{.Id}}"  # outside a block: each asks
    host.calls.clear()
    with memo.kept():
        assert e.holds_image("sha256:abc")
        assert e.inspect_image("sha256:abc") == {"Id": "sha256:abc", "RepoTags": ["img:1"], "Size": 5}
        assert host.calls == [["docker", "image", "inspect", "--format", "{{json .}}", "sha256:abc"]]
        e.inspect_image("sha256:abc")  # handed over once: a later look asks again
        assert len(host.calls) == 2
    host.calls.clear()
    with memo.kept():
        e.ask_image("sha256:abc")  # asked ahead (while git lists a run's code): the check and the ship read it
        assert e.holds_image("sha256:abc") and e.inspect_image("sha256:abc")["Size"] == 5
        assert len(host.calls) == 1
    e.ask_image("sha256:abc")  # outside a block: nothing to keep, nothing asked
    assert len(host.calls) == 1
    remote = FakeHost({("docker", "image", "inspect"): (0, info, "")})
    with memo.kept():
        Engine(remote).holds_image("sha256:abc")
        Engine(remote).inspect_image("sha256:abc")
    assert [c[-2] for c in remote.calls] == ["{{.Id}}", "{{json .}}"]  # a host over SSH: asked each time
