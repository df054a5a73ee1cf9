"""Content-addressed image builds from locked requirements on a digest-pinned base,
build records, and `rebuild --verify`."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher import __version__, docker_engine, images, imagetree, proc, wheels
from launcher.errors import BuildFailed, Corrupt, NotFound
from launcher.hashing import atomic_write_json, sha256_bytes, tree_digest
from launcher.lock import parse_lock
from launcher.progress import NullReporter, Reporter
from launcher.workspace import Workspace

LABEL = "org.launcher."
PACKAGE_DIR = Path(__file__).resolve().parent
RECORD_VERSION = 1
STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)")


@dataclass
class BuildRecord:
    variant: str
    image_id: str
    tag: str
    content: str
    base: str
    lock_sha256: str
    tree_digest: str
    labels: dict[str, str]
    built_at: str
    seconds: float
    noop: bool = False
    record_version: int = RECORD_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("noop")
        return data


@dataclass(frozen=True)
class Inputs:
    variant: str
    dockerfile: Path
    lockfile: Path
    pin: images.BasePin
    lock_sha256: str
    recipes_digest: str
    runtime_digest: str
    content: str
    tag: str


def git_state(root: Path) -> tuple[str, bool]:
    head = proc.run(["git", "-C", root, "rev-parse", "HEAD"], check=False)
    if head.returncode != 0:
        return "unknown", False
    status = proc.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"], check=False)
    return head.out.strip(), bool(status.out.strip())


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "workspace"


def gather(ws: Workspace, variant: str) -> Inputs:
    images.check_variant(variant)
    pin = images.load(ws).get(variant)
    dockerfile = ws.dockerfile(variant)
    images.check_dockerfile(dockerfile, pin)
    lockfile = ws.lock_txt(variant)
    if not lockfile.is_file():
        raise NotFound(f"{lockfile} is missing", f"create it with `launcher lock --variant {variant}`")
    lock_bytes = lockfile.read_bytes()
    parse_lock(lock_bytes.decode(), str(lockfile))
    recipes = tree_digest(ws.recipes) if ws.recipes.is_dir() else "sha256:" + "0" * 64
    runtime = tree_digest(PACKAGE_DIR / "runtime")
    parts = [variant, dockerfile.read_text(), sha256_bytes(lock_bytes), pin.ref, recipes, runtime,
             sha256_bytes((PACKAGE_DIR / "__init__.py").read_bytes())]
    content = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    tag = f"launcher/{_slug(ws.root.name)}-{variant}:{content[:12]}"
    return Inputs(variant, dockerfile, lockfile, pin, sha256_bytes(lock_bytes), recipes, runtime,
                  "sha256:" + content, tag)


def read_record(ws: Workspace, variant: str) -> BuildRecord | None:
    path = ws.build_record(variant)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        data.pop("noop", None)
        return BuildRecord(**data)
    except (ValueError, TypeError) as exc:
        raise Corrupt(f"build record {path} is unreadable: {exc}", f"delete it and run `launcher build {variant}`") \
            from exc


def _context(ws: Workspace, inputs: Inputs, house: wheels.Wheelhouse, into: Path) -> None:
    shutil.copyfile(inputs.dockerfile, into / "Dockerfile")
    shutil.copyfile(inputs.lockfile, into / "lock.txt")
    wheels.link_into(house, into / "wheels")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
    (into / "launcher").mkdir()
    shutil.copyfile(PACKAGE_DIR / "__init__.py", into / "launcher" / "__init__.py")
    shutil.copytree(PACKAGE_DIR / "runtime", into / "launcher" / "runtime", ignore=ignore)
    if ws.recipes.is_dir():
        shutil.copytree(ws.recipes, into / "recipes", ignore=ignore)
    else:
        (into / "recipes").mkdir()
    # The classic builder copies file modes and mtimes; make modes canonical so a
    # checkout's umask does not change the image.
    for p in into.rglob("*"):
        if p.is_symlink():
            continue
        p.chmod(0o755 if p.is_dir() or p.stat().st_mode & 0o100 else 0o644)


def _run_build(context: Path, inputs: Inputs, labels: dict[str, str], nocache: bool, epoch: int,
               reporter: Reporter) -> str:
    task = reporter.task(f"building {inputs.variant} image", total=None)
    image_id: str | None = None
    log: list[str] = []
    for event in docker_engine.build(context, dockerfile="Dockerfile", tag=None,
                                     buildargs={images.BASE_ARG: inputs.pin.ref, "SOURCE_DATE_EPOCH": str(epoch)},
                                     labels=labels, nocache=nocache):
        if "error" in event:
            detail = event.get("error", "").strip()
            tail = " | ".join(ln for ln in log[-3:] if ln)
            raise BuildFailed(f"image build failed: {detail}" + (f" (last output: {tail[:300]})" if tail else ""),
                              "fix the Dockerfile or the lock; nothing was tagged")
        text = event.get("stream", "")
        if text:
            for line in text.splitlines():
                log.append(line.strip())
                m = STEP.match(line.strip())
                if m:
                    task.update(completed=int(m.group(1)) - 1, total=int(m.group(2)),
                                description=f"{inputs.variant}: {m.group(3)[:60]}")
        aux = event.get("aux") or {}
        if "ID" in aux:
            image_id = aux["ID"]
    task.close()
    if image_id is None:
        raise BuildFailed("the Docker engine finished the build without an image ID", "rerun with --debug")
    return image_id


def build(ws: Workspace, variant: str = "cpu", *, nocache: bool = False, force: bool = False,
          ca_bundle: Path | None = None, epoch: int = imagetree.DEFAULT_EPOCH, tag: str | None = None,
          write_record: bool = True, keep_image: bool = True, reporter: Reporter | None = None) -> BuildRecord:
    """Build (or find) the image of variant; the result is normalised to a content-only image ID."""
    rep = reporter or NullReporter()
    started = time.monotonic()
    inputs = gather(ws, variant)
    out_tag = tag or inputs.tag
    if not nocache and not force:
        found = _existing(ws, variant, inputs)
        if found is not None:
            return found
    docker_engine.require()
    _ensure_base(inputs.pin)
    house = wheels.download(inputs.lockfile, ws.wheelhouse, python=inputs.pin.python,
                            platform=inputs.pin.platform, ca_bundle=ca_bundle, reporter=rep)
    commit, dirty = git_state(ws.root)
    labels = {
        LABEL + "variant": variant,
        LABEL + "content": inputs.content,
        LABEL + "lock-sha256": inputs.lock_sha256,
        LABEL + "base": inputs.pin.ref,
        LABEL + "base-digest": inputs.pin.digest,
        LABEL + "git-commit": commit,
        LABEL + "git-dirty": "true" if dirty else "false",
        LABEL + "version": __version__,
    }
    with tempfile.TemporaryDirectory(prefix="launcher-build-") as tmp:
        ctx = Path(tmp) / "context"
        ctx.mkdir()
        _context(ws, inputs, house, ctx)
        raw_id = _run_build(ctx, inputs, labels, nocache, epoch, rep)
    task = rep.task("normalising layers for a reproducible image ID")
    try:
        keys = imagetree.base_layer_keys(inputs.pin.ref, ws.cache_dir)
        norm = imagetree.normalize(raw_id, tag=out_tag, base_keys=keys, epoch=epoch,
                                   layer_cache=ws.cache_dir / "images" if write_record else None, load=keep_image)
    finally:
        docker_engine.remove_image(raw_id)
    task.close()
    result = BuildRecord(
        variant=variant, image_id=norm.image_id, tag=out_tag, content=inputs.content, base=inputs.pin.ref,
        lock_sha256=inputs.lock_sha256, tree_digest=norm.tree_digest, labels=labels,
        built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), seconds=round(time.monotonic() - started, 2),
        extra={"recipes_digest": inputs.recipes_digest, "runtime_digest": inputs.runtime_digest,
               "epoch": epoch, "files": len(norm.tree)},
    )
    if write_record:
        for path in (ws.build_record(variant), _cached_record(ws, inputs)):
            imagetree.save_tree(path.with_suffix(".tree.json.gz"), norm.tree)
            atomic_write_json(path, result.to_json())
    result.extra["tree"] = norm.tree
    return result


def _cached_record(ws: Workspace, inputs: Inputs) -> Path:
    return ws.cache_dir / "builds" / f"{inputs.content.removeprefix('sha256:')}.json"


def _existing(ws: Workspace, variant: str, inputs: Inputs) -> BuildRecord | None:
    """A build of exactly these inputs whose image is still in the engine: the workspace's
    own record first, then one cached by content from another workspace on this machine."""
    candidates = [ws.build_record(variant), _cached_record(ws, inputs)]
    for path in candidates:
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
            data.pop("noop", None)
            rec = BuildRecord(**data)
        except (ValueError, TypeError):
            continue
        if rec.content != inputs.content or not docker_engine.image_exists(rec.tag):
            continue
        if docker_engine.inspect(rec.tag)["Id"] != rec.image_id:
            continue
        if path != candidates[0]:
            tree = path.with_suffix(".tree.json.gz")
            if not tree.is_file():
                continue
            candidates[0].parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree, candidates[0].with_suffix(".tree.json.gz"))
            atomic_write_json(candidates[0], rec.to_json())
        rec.noop = True
        return rec
    return None


def _ensure_base(pin: images.BasePin) -> dict[str, Any]:
    if docker_engine.image_exists(pin.ref):
        return docker_engine.inspect(pin.ref)
    pulled = proc.run(["docker", "pull", pin.ref], check=False)
    if pulled.returncode != 0:
        raise NotFound(f"base image {pin.ref} cannot be pulled: {pulled.last_error_line()}",
                       "check the digest exists in its registry, or pin a reachable base with "
                       "`launcher base bootstrap --start-registry`")
    return docker_engine.inspect(pin.ref)


@dataclass
class RebuildReport:
    variant: str
    recorded_image_id: str
    rebuilt_image_id: str
    recorded_tree: str
    rebuilt_tree: str
    changes: list[dict[str, str]]
    seconds: float

    @property
    def tree_matches(self) -> bool:
        return self.recorded_tree == self.rebuilt_tree

    @property
    def id_matches(self) -> bool:
        return self.recorded_image_id == self.rebuilt_image_id


def rebuild(ws: Workspace, variant: str = "cpu", *, verify: bool = True, ca_bundle: Path | None = None,
            reporter: Reporter | None = None) -> RebuildReport:
    """Rebuild from scratch (no cache) and compare with the recorded build."""
    started = time.monotonic()
    record = read_record(ws, variant)
    if verify and record is None:
        raise NotFound(f"no recorded build of the {variant} image to verify against",
                       f"run `launcher build {variant}` first")
    epoch = int(record.extra.get("epoch", imagetree.DEFAULT_EPOCH)) if record else imagetree.DEFAULT_EPOCH
    # A verifying rebuild needs only the digests of the normalised image, not the image itself.
    fresh = build(ws, variant, nocache=True, ca_bundle=ca_bundle, epoch=epoch, write_record=not verify,
                  keep_image=not verify, reporter=reporter)
    if not verify or record is None:
        return RebuildReport(variant, fresh.image_id, fresh.image_id, fresh.tree_digest, fresh.tree_digest, [],
                             round(time.monotonic() - started, 2))
    tree_path = ws.build_record(variant).with_suffix(".tree.json.gz")
    old_tree = imagetree.load_tree(tree_path) if tree_path.is_file() else {}
    changes = imagetree.diff_trees(old_tree, fresh.extra["tree"]) if fresh.tree_digest != record.tree_digest else []
    return RebuildReport(variant, record.image_id, fresh.image_id, record.tree_digest, fresh.tree_digest, changes,
                         round(time.monotonic() - started, 2))
