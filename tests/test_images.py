"""Base pins: references, images.lock, Dockerfile FROM checks, `base resolve` against a real registry."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode, PinMismatch, UsageError
from launcher.images import pins as images
from launcher.images.imageref import ImageRef
from launcher.scaffold import init_workspace
from launcher.workspace import Workspace

runner = CliRunner()
DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


def pin(ref: str = f"python:3.11-slim@{DIGEST}") -> images.BasePin:
    return images.BasePin("cpu", ref)


@pytest.mark.parametrize(("ref", "expected"), [
    ("python:3.11-slim", ("docker.io", "library/python", "3.11-slim", None)),
    (f"127.0.0.1:5000/base:bookworm@{DIGEST}", ("127.0.0.1:5000", "base", "bookworm", DIGEST)),
    ("ghcr.io/org/img", ("ghcr.io", "org/img", None, None)),
])
def test_image_ref_parse(ref: str, expected: tuple[str, str, str | None, str | None]) -> None:
    r = ImageRef.parse(ref)
    assert (r.registry, r.repository, r.tag, r.digest) == expected


def test_malformed_digest_is_refused() -> None:
    with pytest.raises(UsageError, match="malformed digest"):
        ImageRef.parse("python@sha256:1234")


def test_dockerfile_with_unpinned_from_is_refused(tmp_path: Path) -> None:
    df = tmp_path / "cpu.Dockerfile"
    df.write_text("FROM python:3.11-slim\nRUN true\n")
    with pytest.raises(PinMismatch, match="has no digest"):
        images.check_dockerfile(df, pin())


def test_dockerfile_with_other_digest_is_refused(tmp_path: Path) -> None:
    df = tmp_path / "cpu.Dockerfile"
    df.write_text(f"FROM python:3.11-slim@{OTHER}\n")
    with pytest.raises(PinMismatch, match=r"disagrees with images\.lock"):
        images.check_dockerfile(df, pin())


def test_dockerfile_with_base_arg_and_stages_is_accepted(tmp_path: Path) -> None:
    df = tmp_path / "cpu.Dockerfile"
    df.write_text(f"ARG LAUNCHER_BASE\nFROM ${{LAUNCHER_BASE}} AS venv\nFROM python@{DIGEST}\nFROM venv\n")
    assert images.check_dockerfile(df, pin()) == ["${LAUNCHER_BASE}", f"python@{DIGEST}", "venv"]


def test_images_lock_round_trip_and_refusal_of_tags(tmp_path: Path) -> None:
    init_workspace(tmp_path)
    ws = Workspace.at(tmp_path)
    lock = images.load(ws)
    assert lock.get("cpu").digest.startswith("sha256:")
    assert images.save(ws, lock) is False  # unchanged content is not rewritten
    ws.images_lock.write_text('[cpu]\nref = "python:3.11-slim"\n')
    with pytest.raises(PinMismatch, match="has no digest"):
        images.load(ws)


def test_committed_templates_match_this_workspace() -> None:
    root = Path(__file__).resolve().parents[1]
    tpl = root / "launcher" / "templates"
    for name, path in [("cpu.in", "lockfiles/cpu.in"), ("gpu.in", "lockfiles/gpu.in"),
                       ("cpu.Dockerfile", "dockerfiles/cpu.Dockerfile"),
                       ("gpu.Dockerfile", "dockerfiles/gpu.Dockerfile")]:
        assert (tpl / name).read_text() == (root / path).read_text(), name
    # the workspace has more variants than `launcher init` writes; the two it shares are pinned alike
    repo_pins = images.load(Workspace.at(root)).pins
    tpl_text = (tpl / "images.lock").read_text()
    for variant in ("cpu", "gpu"):
        assert f'[{variant}]\nref = "{repo_pins[variant].ref}"' in tpl_text, variant


def test_any_variant_with_an_in_file_and_a_dockerfile_is_the_workspaces(tmp_path: Path) -> None:
    init_workspace(tmp_path)
    ws = Workspace.at(tmp_path)
    (ws.lockfiles / "torch-cpu.in").write_text("torch\npip\nsetuptools\n")
    (ws.dockerfiles / "torch-cpu.Dockerfile").write_text((ws.dockerfiles / "cpu.Dockerfile").read_text())
    (ws.lockfiles / "half.in").write_text("six\n")  # no Dockerfile: not a variant
    (ws.dockerfiles / "tpu.Dockerfile").write_text('FROM x\nLABEL launcher.accelerator="tpu"\n')
    assert ws.variants() == ("cpu", "gpu", "torch-cpu")
    # a GPU variant says so in its Dockerfile; the name alone decides only for a label-less "gpu"
    assert [ws.accelerator(v) for v in ("cpu", "gpu", "torch-cpu", "tpu")] == ["cpu", "gpu", "cpu", "cpu"]
    (ws.dockerfiles / "torch-cpu.Dockerfile").write_text("FROM x\nLABEL  launcher.accelerator=gpu other=1\n")
    assert ws.needs_gpu("torch-cpu")
    # images.lock takes a section for any variant name, and refuses what cannot be one
    text = ws.images_lock.read_text()
    ref = images.load(ws).get("cpu").ref
    ws.images_lock.write_text(text + f'\n[torch-cpu]\nref = "{ref}"\n')
    assert images.load(ws).get("torch-cpu").ref == ref
    ws.images_lock.write_text(text + f'\n["Torch CPU"]\nref = "{ref}"\n')
    with pytest.raises(PinMismatch, match="not a variant section"):
        images.load(ws)
    res = runner.invoke(app, ["-w", str(tmp_path), "build", "--variant", "../x"])
    assert res.exit_code == ExitCode.USAGE, res.output


@pytest.mark.registry
def test_base_resolve_against_a_real_registry(base_ref: str, tmp_path: Path) -> None:
    init_workspace(tmp_path)
    tag_ref, _, digest = base_ref.partition("@")
    res = runner.invoke(app, ["-w", str(tmp_path), "--json", "base", "resolve", tag_ref, "--variant", "cpu"])
    assert res.exit_code == 0, res.output
    assert images.load(Workspace.at(tmp_path)).get("cpu").ref == base_ref
    assert digest in res.output


@pytest.mark.registry
def test_base_resolve_of_a_digest_that_does_not_exist(base_ref: str, tmp_path: Path) -> None:
    init_workspace(tmp_path)
    before = (tmp_path / "lockfiles" / "images.lock").read_text()
    tag_ref = base_ref.partition("@")[0]
    res = runner.invoke(app, ["-w", str(tmp_path), "base", "resolve", f"{tag_ref}@{OTHER}"])
    assert res.exit_code == ExitCode.NOT_FOUND, res.output
    assert "does not exist" in res.output
    assert (tmp_path / "lockfiles" / "images.lock").read_text() == before


def test_unreachable_registry(tmp_path: Path) -> None:
    init_workspace(tmp_path)
    res = runner.invoke(app, ["-w", str(tmp_path), "base", "resolve", "127.0.0.1:9/none:tag"])
    assert res.exit_code == ExitCode.REGISTRY_UNAVAILABLE, res.output
    assert "cannot reach registry 127.0.0.1:9" in res.output
