"""Property-based tests (hypothesis) of what reads a stranger's files: random tars and honest bundles changed
at random, fed to the bundle reader; random and mutated envelopes fed to `launcher attest verify`.

Whatever the input: nothing is written outside the folder the bundle is opened into (nor in it, when the
bundle is refused: nothing is written before its signature and listing check out), nothing is executed
(no process starts: the trust is a PEM key, checked in-process), the failure is a LauncherError whose exit
code is one `attest verify` documents, and a bundle that is accepted holds exactly the files its signed
statement names. Bounded (a fixed number of examples, derandomized, no example database) so the suite's
fast tier runs them in seconds, the same examples each time."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hostile as h
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as s
from typer.testing import CliRunner

from launcher import proc
from launcher.attest.bundle import ENVELOPE
from launcher.attest.signers import PemSigner, Trust
from launcher.attest.unpack import open_bundle
from launcher.cli import app
from launcher.errors import ExitCode, LauncherError
from launcher.hashing import sha256_file

BOUNDED = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# what opening a bundle may answer (docs/attest.md, "Exit codes")
BUNDLE_CODES = {ExitCode.CORRUPT, ExitCode.UNSAFE_PATH, ExitCode.DISK_FULL, ExitCode.BAD_SIGNATURE,
                ExitCode.DIGEST_MISMATCH, ExitCode.UNKNOWN_SIGNER}
# what `attest verify FILE --run DIR` may answer
VERIFY_CODES = {ExitCode.OK, ExitCode.USAGE, ExitCode.NOT_FOUND, ExitCode.CORRUPT, ExitCode.BAD_SIGNATURE,
                ExitCode.DIGEST_MISMATCH, ExitCode.UNKNOWN_SIGNER, ExitCode.NOT_REPRODUCIBLE, ExitCode.INCONCLUSIVE,
                ExitCode.OTHER_IMAGE, ExitCode.INCOMPATIBLE, ExitCode.UNSAFE_PATH}


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An honest bundle's members and an honest run's envelope, made once for every example."""
    tmp = tmp_path_factory.mktemp("fuzz")
    private, public = h.pem_keys(tmp / "keys")
    signer = PemSigner(private)
    forged = h.honest(tmp, signer, mounted=True, data={"numbers.txt": b"1 2 3\n"})
    envelope = h.sign_statement(h.statement_of(forged.files, forged.predicate), signer)
    members = h.members_of(forged.files, envelope)
    signed = {n: sha256_file_bytes(b) for n, b in forged.files.items()}
    return {"members": members, "trust": Trust.of(None, [public]), "public": public, "signed": signed,
            "run_dir": forged.run_dir,
            "envelope": (forged.run_dir / "attestation" / "provenance.dsse.json").read_bytes()}


def sha256_file_bytes(data: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def no_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every attempt to start a process, recorded and refused."""
    started: list[str] = []

    def refuse(argv: Any, *args: Any, **kwargs: Any) -> Any:
        started.append(str(argv))
        raise AssertionError(f"a process was started: {argv}")

    monkeypatch.setattr(proc, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    yield started


def listing(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def open_checked(raw: bytes, trust: Trust, signed: dict[str, str] | None = None) -> None:
    """Open raw as a bundle in a fresh folder; assert the properties above whatever it holds."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        path = tmp / "in.bundle"
        path.write_bytes(raw)
        (tmp / "sibling").mkdir()
        (tmp / "sibling" / "keep.txt").write_text("the reviewer's\n")
        before = listing(tmp)
        into = tmp / "open"
        try:
            opened = open_bundle(path, trust, into)
        except LauncherError as exc:
            assert exc.exit_code in BUNDLE_CODES, (exc.exit_code, exc.message)
            assert "\n" not in exc.one_line()
            assert not into.exists(), "a refused bundle left files behind"  # nothing is written before it checks out
            opened = None
        outside = {p for p in listing(tmp) - before if not p.startswith("open/") and p != "open"}
        assert outside == set(), f"written outside the folder: {sorted(outside)}"
        if opened is not None:  # accepted: exactly the signed files, each as signed
            assert signed is not None, "a random tar was accepted as a bundle"
            got = {p.relative_to(into).as_posix(): sha256_file(p) for p in into.rglob("*") if p.is_file()}
            got.pop(ENVELOPE, None)
            assert got == signed


PARTS = s.sampled_from(["runs", "a", "b", "..", ".", "", ".git", "bundle.dsse.json", "images", "code", "x" * 120,
                        "data", "outputs", "manifest.json", "-", " ", "\\", "é"])
NAMES = s.lists(PARTS, min_size=1, max_size=5).map("/".join) | s.lists(PARTS, min_size=1, max_size=3).map(
    lambda p: "/" + "/".join(p))
KINDS = s.sampled_from(["file", "file", "file", "dir", "symlink", "hardlink", "fifo", "sparse", "char"])


@s.composite
def members(draw: Any) -> tuple[tarfile.TarInfo, bytes]:
    name, kind = draw(NAMES), draw(KINDS)
    data = draw(s.binary(max_size=64))
    if kind == "sparse":
        return h.sparse(name, draw(s.integers(0, 1 << 40)), data or b"x")
    if kind in ("symlink", "hardlink"):
        return h.link(name, draw(NAMES), hard=kind == "hardlink")
    info = tarfile.TarInfo(name)
    if kind == "file":
        info.size, info.mode = len(data), draw(s.sampled_from([0o644, 0o755, 0o4755, 0o777]))
        return info, data
    info.type = {"dir": tarfile.DIRTYPE, "fifo": tarfile.FIFOTYPE, "char": tarfile.CHRTYPE}[kind]
    return info, b""


def tar_bytes(items: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in items:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buf.getvalue()


@BOUNDED
@given(items=s.lists(members(), max_size=8), envelope=s.booleans())
def test_random_tars_are_refused_safely(material: dict[str, Any], no_process: list[str],
                                        items: list[tuple[tarfile.TarInfo, bytes]], envelope: bool) -> None:
    if envelope:  # some random tars carry a real envelope, so the reader gets past its first check
        items = [*items, next(m for m in material["members"] if m[0].name == ENVELOPE)]
    open_checked(tar_bytes(items), material["trust"])
    assert no_process == []


MUTATIONS = s.sampled_from(["flip data", "drop", "duplicate", "rename", "add", "to link", "to sparse",
                            "truncate", "flip raw", "grow"])


@BOUNDED
@given(mutation=MUTATIONS, which=s.integers(0, 1000), byte=s.integers(0, 255), name=NAMES)
def test_changed_bundles_are_refused_or_hold_exactly_what_was_signed(
        material: dict[str, Any], no_process: list[str], mutation: str, which: int, byte: int, name: str) -> None:
    items = list(material["members"])
    i = which % len(items)
    info, data = items[i]
    changed = tarfile.TarInfo(info.name)
    changed.size, changed.mode = info.size, info.mode
    if mutation == "flip data" and data:
        data = data[:which % len(data)] + bytes([data[which % len(data)] ^ (byte | 1)]) + data[which % len(data) + 1:]
        items[i] = (changed, data)
    elif mutation == "drop":
        del items[i]
    elif mutation == "duplicate":
        items.insert(i, items[i])
    elif mutation == "rename":
        changed.name = name
        items[i] = (changed, data)
    elif mutation == "add":
        items.insert(i, h.regular(name, bytes([byte]) * (which % 64)))
    elif mutation == "to link":
        items[i] = h.link(info.name, name)
    elif mutation == "to sparse":
        items[i] = h.sparse(info.name, 1 << 30, data or b"x")
    elif mutation == "grow":
        items[i] = h.regular(info.name, data + bytes([byte]))
    raw = tar_bytes(items)
    if mutation == "truncate":
        raw = raw[:which * len(raw) // 1000]
    elif mutation == "flip raw":
        at = (which * 7919) % len(raw)
        raw = raw[:at] + bytes([raw[at] ^ (byte | 1)]) + raw[at + 1:]
    open_checked(raw, material["trust"], material["signed"])
    assert no_process == []


def _mutate_json(value: Any, path: list[int], byte: int) -> Any:
    """value with one part replaced, chosen by path (a list of small integers) and byte."""
    replacements: list[Any] = [None, "", 0, -1, True, [], {}, "x" * 300, "../../etc/passwd", "A" * 10 + "=",
                               {"sha256": "0" * 64}, [{"name": "../x", "digest": {"sha256": "0" * 64}}]]
    if not path or not isinstance(value, dict | list) or not value:
        return replacements[byte % len(replacements)]
    if isinstance(value, dict):
        keys = sorted(value)
        key = keys[path[0] % len(keys)]
        out = dict(value)
        if byte % 17 == 0:
            del out[key]
        else:
            out[key] = _mutate_json(value[key], path[1:], byte)
        return out
    out_list = list(value)
    j = path[0] % len(out_list)
    out_list[j] = _mutate_json(value[j], path[1:], byte)
    return out_list


@BOUNDED
@given(part=s.sampled_from(["envelope", "payload", "raw"]), path=s.lists(s.integers(0, 50), max_size=6),
       byte=s.integers(0, 255))
def test_mutated_envelopes_get_a_documented_exit_code_and_no_traceback(
        material: dict[str, Any], no_process: list[str], part: str, path: list[int], byte: int) -> None:
    env = json.loads(material["envelope"])
    if part == "envelope":
        data = json.dumps(_mutate_json(env, path, byte)).encode()
    elif part == "payload":
        statement = json.loads(base64.b64decode(env["payload"]))
        env["payload"] = base64.b64encode(json.dumps(_mutate_json(statement, path, byte)).encode()).decode()
        data = json.dumps(env).encode()
    else:
        raw = bytearray(material["envelope"])
        at = (sum(path) * 7919 + byte) % len(raw)
        raw[at] ^= byte | 1
        data = bytes(raw)
    with tempfile.TemporaryDirectory() as tmp_name:
        file = Path(tmp_name) / "x.dsse.json"
        file.write_bytes(data)
        result = CliRunner().invoke(app, ["--quiet", "--json", "attest", "verify", str(file), "--key",
                                          str(material["public"]), "--run", str(material["run_dir"])])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code in VERIFY_CODES, (result.exit_code, result.stderr)
    assert "Traceback" not in result.stderr
    if result.exit_code == 0:  # accepted: what it names is what the author signed
        statement = json.loads(base64.b64decode(json.loads(data)["payload"]))
        assert statement == json.loads(base64.b64decode(json.loads(material["envelope"])["payload"]))
    assert no_process == []


def test_the_properties_hold_for_the_honest_bundle(material: dict[str, Any], no_process: list[str]) -> None:
    # the baseline: unchanged, it is accepted and holds exactly the signed files
    open_checked(tar_bytes(material["members"]), material["trust"], material["signed"])
