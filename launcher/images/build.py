"""Content-addressed image builds from locked requirements on a digest-pinned base,
build records, and `rebuild --verify`."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher import __version__, proc
from launcher.errors import BuildFailed, ImageOutOfDate, NotFound
from launcher.hashing import atomic_write_bytes, atomic_write_json, sha256_bytes
from launcher.hosts import dockerapi, engine
from launcher.images import pins as images
from launcher.images.buildrecord import DEFAULT_EPOCH, BuildRecord, read_record
from launcher.images.lock import parse_lock
from launcher.progress import NullReporter, Reporter
from launcher.runtime import code as codedigest
from launcher.workspace import Workspace

if TYPE_CHECKING:
    from launcher.images import recipelayer, wheels

# What builds (the wheelhouse, the recipe layer, an offline build's errors) is imported by the functions that
# build: a run whose image is current only checks it.

LABEL = "org.launcher."
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # launcher/
STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)")
STEP_IMAGE = re.compile(r"^---> ([0-9a-f]{12,64})$")


@dataclass(frozen=True)
class Inputs:
    variant: str
    dockerfile: Path
    lockfile: Path
    pin: images.BasePin
    lock_sha256: str
    recipes_digest: str
    runtime_digest: str
    env_content: str  # what the Dockerfile builds: Dockerfile, lock, base, runtime
    content: str  # env_content and the recipes: the whole image
    tag: str

    @property
    def env_tag(self) -> str:
        return f"{self.tag.rsplit(':', 1)[0]}-env:{self.env_content.removeprefix('sha256:')[:12]}"

    def parts(self) -> dict[str, str]:
        """What each part of the image was built from, by name (for notices of what changed)."""
        return {"dockerfile": sha256_bytes(self.dockerfile.read_bytes()), "lock": self.lock_sha256,
                "base": self.pin.digest, "runtime": self.runtime_digest, "recipes": self.recipes_digest}


def git_state(root: Path) -> tuple[str, bool]:
    """The commit of the work tree holding root, and whether anything under root differs from it."""
    head = proc.run(["git", "-C", root, "rev-parse", "HEAD"], check=False)
    if head.returncode != 0:
        return "unknown", False
    status = proc.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", "."], check=False)
    return head.out.strip(), bool(status.out.strip())


def slug(name: str) -> str:
    """A name as an image repository or tag part: lower-case letters, digits and '-'."""
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
    recipes = codedigest.code_digest(ws.recipes) if ws.recipes.is_dir() else "sha256:" + "0" * 64
    runtime = codedigest.runtime_digest(PACKAGE_DIR)
    env_content = env_content_of(variant, dockerfile.read_text(), sha256_bytes(lock_bytes), pin.ref, runtime)
    content = hashlib.sha256(f"{env_content.removeprefix('sha256:')}\n{recipes}".encode()).hexdigest()
    tag = f"launcher/{slug(ws.root.name)}-{variant}:{content[:12]}"
    return Inputs(variant, dockerfile, lockfile, pin, sha256_bytes(lock_bytes), recipes, runtime,
                  env_content, "sha256:" + content, tag)


def env_content_of(variant: str, dockerfile_text: str, lock_sha256: str, base_ref: str, runtime_digest: str) -> str:
    """What the Dockerfile's part of an image is built from, as one digest (the label
    org.launcher.env-content): so a Dockerfile can be checked against an image built from it."""
    parts = [variant, dockerfile_text, lock_sha256, base_ref, runtime_digest]
    return "sha256:" + hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _context(ws: Workspace, inputs: Inputs, house: wheels.Wheelhouse, into: Path) -> None:
    from launcher.images import wheels

    shutil.copyfile(inputs.dockerfile, into / "Dockerfile")
    shutil.copyfile(inputs.lockfile, into / "lock.txt")
    wheels.link_into(house, into / "wheels")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
    (into / "launcher").mkdir()
    shutil.copyfile(PACKAGE_DIR / "__init__.py", into / "launcher" / "__init__.py")
    shutil.copytree(PACKAGE_DIR / "runtime", into / "launcher" / "runtime", ignore=ignore)
    # The recipes are launcher's own last layer (recipelayer.py). An older Dockerfile that still
    # copies recipes/ gets an empty folder.
    (into / "recipes").mkdir()
    # The classic builder copies file modes and mtimes; make modes canonical so a
    # checkout's umask does not change the image.
    for p in into.rglob("*"):
        if p.is_symlink():
            continue
        p.chmod(0o755 if p.is_dir() or p.stat().st_mode & 0o100 else 0o644)


def _run_build(context: Path, inputs: Inputs, labels: dict[str, str], nocache: bool, epoch: int,
               reporter: Reporter, created: list[str]) -> str:
    """Build the Dockerfile; the image ID. created: every step's image this build made (not those it took
    from the engine's cache, nor the base), in order, for the caller to remove: they are launcher's own."""
    from launcher.images import offline

    task = reporter.task(f"building {inputs.variant} image", total=None)
    image_id: str | None = None
    log: list[str] = []
    step: str | None = None
    from_step = cached = False
    for event in dockerapi.build(context, dockerfile="Dockerfile", tag=None,
                                     buildargs={images.BASE_ARG: inputs.pin.ref, "SOURCE_DATE_EPOCH": str(epoch)},
                                     labels=labels, nocache=nocache):
        if "error" in event:
            raise offline.build_failure(inputs.variant, step, str(event.get("error", "")), log)
        text = event.get("stream", "")
        if text:
            for line in text.splitlines():
                log.append(line.strip())
                m = STEP.match(line.strip())
                if m:
                    task.update(completed=int(m.group(1)) - 1, total=int(m.group(2)),
                                description=f"{inputs.variant}: {m.group(3)[:60]}")
                    from_step, cached = m.group(3).upper().startswith("FROM "), False
                    step = m.group(3)
                elif line.strip() == "---> Using cache":
                    cached = True
                elif (step_image := STEP_IMAGE.match(line.strip())) is not None:
                    if not from_step and not cached:
                        created.append(step_image.group(1))
                    cached = False
        aux = event.get("aux") or {}
        if "ID" in aux:
            image_id = aux["ID"]
    task.close()
    if image_id is None:
        raise BuildFailed("the Docker engine finished the build without an image ID", "rerun with --debug")
    return image_id


@dataclass(frozen=True)
class EnvImage:
    """The normalised image the Dockerfile builds: everything but the recipes layer."""
    image_id: str
    config: bytes
    tree: dict[str, str]
    labels: dict[str, str]


def _recipes_layer(ws: Workspace, env: EnvImage, inputs: Inputs, labels: dict[str, str], epoch: int,
                   out_tag: str, *, write_record: bool, keep_image: bool,
                   reporter: Reporter) -> tuple[recipelayer.RecipesLayer, str]:
    """The recipes' layer on the environment image: its layer and the image's ID (loaded into the engine as
    out_tag with keep_image, the image that tag named before removed when nothing else uses it)."""
    from launcher.images import recipelayer

    layer_cache = ws.cache_dir / "images"
    task = reporter.task("adding the recipes layer")
    try:
        layer = recipelayer.write_layer(ws.recipes, layer_cache, epoch)
        config = recipelayer.compose_config(env.config, layer, labels, epoch, inputs.recipes_digest)
        image_id = recipelayer.image_id_of(config)
        if write_record:
            atomic_write_bytes(layer_cache / "configs" / f"{image_id.removeprefix('sha256:')}.json", config)
        if keep_image:
            previous = dockerapi.tagged_id(out_tag)
            recipelayer.load(config, layer, out_tag)
            if previous is not None and previous != image_id:
                dockerapi.remove_unreferenced([previous], launcher_only=True)
    finally:
        task.close()
    return layer, image_id


def build(ws: Workspace, variant: str = "cpu", *, nocache: bool = False, force: bool = False,
          ca_bundle: Path | None = None, find_links: Sequence[Path] = (), epoch: int = DEFAULT_EPOCH,
          tag: str | None = None, write_record: bool = True, keep_image: bool = True,
          git: tuple[str, bool] | None = None, reporter: Reporter | None = None) -> BuildRecord:
    """Build (or find) the image of variant; the result is normalised to a content-only image ID.

    The Dockerfile's part (base, venv, runtime) is built and normalised only when its inputs
    changed; the recipes are launcher's own last layer on top of it (recipelayer.py), so a
    recipe edit costs seconds. git: the (commit, dirty) labels to use instead of the work tree's.
    """
    from launcher.images import tree as imagetree

    rep = reporter or NullReporter()
    started = time.monotonic()
    inputs = gather(ws, variant)
    out_tag = tag or inputs.tag
    if not nocache and not force:
        found = _existing(ws, variant, inputs)
        if found is not None:
            return found
    dockerapi.require()
    env = None if nocache or force else _existing_env(ws, inputs)
    if env is None:
        env = _build_env(ws, inputs, nocache=nocache, ca_bundle=ca_bundle, find_links=find_links, epoch=epoch,
                         write_record=write_record, keep_image=keep_image, reporter=rep)
    commit, dirty = git or git_state(ws.root)
    labels = {
        LABEL + "content": inputs.content,
        LABEL + "recipes-digest": inputs.recipes_digest,
        LABEL + "git-commit": commit,
        LABEL + "git-dirty": "true" if dirty else "false",
    }
    layer, image_id = _recipes_layer(ws, env, inputs, labels, epoch, out_tag, write_record=write_record,
                                     keep_image=keep_image, reporter=rep)
    tree = imagetree.apply_entries(env.tree, layer.entries)
    result = BuildRecord(
        variant=variant, image_id=image_id, tag=out_tag, content=inputs.content, base=inputs.pin.ref,
        lock_sha256=inputs.lock_sha256, tree_digest=imagetree.lines_digest(tree), labels={**env.labels, **labels},
        built_at=time.strftime(imagetree.STAMP_FORMAT, time.gmtime()), seconds=round(time.monotonic() - started, 2),
        extra={"recipes_digest": inputs.recipes_digest, "runtime_digest": inputs.runtime_digest,
               "recipes": layer.digests, "env_content": inputs.env_content, "env_image_id": env.image_id,
               "parts": inputs.parts(), "epoch": epoch, "files": len(tree)},
    )
    if write_record:
        for path in (ws.build_record(variant), cached_record(ws, inputs)):
            imagetree.save_tree(path.with_suffix(".tree.json.gz"), tree)
            atomic_write_json(path, result.to_json())
    result.extra["tree"] = tree
    return result


def _env_record(ws: Workspace, inputs: Inputs) -> Path:
    return ws.cache_dir / "builds" / f"env-{inputs.env_content.removeprefix('sha256:')}.json"


def _existing_env(ws: Workspace, inputs: Inputs) -> EnvImage | None:
    """The environment image of these inputs, if it was built here and the engine still has it."""
    from launcher.images import recipelayer
    from launcher.images import tree as imagetree

    path = _env_record(ws, inputs)
    tree_path = path.with_suffix(".tree.json.gz")
    try:
        rec = json.loads(path.read_text())
        image_id = rec["image_id"]
        config = (ws.cache_dir / "images" / "configs" / f"{image_id.removeprefix('sha256:')}.json").read_bytes()
        tree = imagetree.load_tree(tree_path)
    except (OSError, ValueError, KeyError):
        return None
    if recipelayer.image_id_of(config) != image_id or not dockerapi.image_exists(image_id):
        return None
    return EnvImage(image_id, config, tree, dict(rec.get("labels") or {}))


def _build_env(ws: Workspace, inputs: Inputs, *, nocache: bool, ca_bundle: Path | None, find_links: Sequence[Path],
               epoch: int, write_record: bool, keep_image: bool, reporter: Reporter) -> EnvImage:
    """Build the Dockerfile (offline, from the wheelhouse) and normalise the result."""
    from launcher.images import tree as imagetree
    from launcher.images import wheels

    _ensure_base(inputs.pin)
    house = wheels.download(inputs.lockfile, ws.wheelhouse, python=inputs.pin.python,
                            platform=inputs.pin.platform, ca_bundle=ca_bundle, find_links=find_links,
                            reporter=reporter)
    labels = {
        LABEL + "variant": inputs.variant,
        LABEL + "env-content": inputs.env_content,
        LABEL + "lock-sha256": inputs.lock_sha256,
        LABEL + "base": inputs.pin.ref,
        LABEL + "base-digest": inputs.pin.digest,
        LABEL + "runtime-digest": inputs.runtime_digest,
        LABEL + "version": __version__,
    }
    created: list[str] = []  # the build's own step images: none stays (an unreferenced 2 GB venv stage would)
    previous = dockerapi.tagged_id(inputs.env_tag) if keep_image else None
    try:
        with tempfile.TemporaryDirectory(prefix="launcher-build-") as tmp:
            ctx = Path(tmp) / "context"
            ctx.mkdir()
            _context(ws, inputs, house, ctx)
            raw_id = _run_build(ctx, inputs, labels, nocache, epoch, reporter, created)
        task = reporter.task("normalising layers for a reproducible image ID")
        try:
            keys = imagetree.base_layer_keys(inputs.pin.ref, ws.cache_dir)
            norm = imagetree.normalize(raw_id, tag=inputs.env_tag, base_keys=keys, epoch=epoch,
                                       layer_cache=ws.cache_dir / "images" if write_record else None,
                                       load=keep_image)
        finally:
            dockerapi.remove_image(raw_id)
        task.close()
    finally:
        dockerapi.remove_unreferenced(created)
    if previous is not None and previous != norm.image_id:  # the tag moved: the image it left is nobody's
        dockerapi.remove_unreferenced([previous], launcher_only=True)
    if write_record:
        path = _env_record(ws, inputs)
        imagetree.save_tree(path.with_suffix(".tree.json.gz"), norm.tree)
        atomic_write_json(path, {"image_id": norm.image_id, "tag": inputs.env_tag, "labels": labels,
                                 "tree_digest": norm.tree_digest, "epoch": epoch})
    return EnvImage(norm.image_id, norm.config, norm.tree, labels)


def cached_record(ws: Workspace, inputs: Inputs) -> Path:
    return ws.cache_dir / "builds" / f"{inputs.content.removeprefix('sha256:')}.json"


def _existing(ws: Workspace, variant: str, inputs: Inputs) -> BuildRecord | None:
    """A build of exactly these inputs whose image is still in the engine: the workspace's
    own record first, then one cached by content from another workspace on this machine."""
    candidates = [ws.build_record(variant), cached_record(ws, inputs)]
    for path in candidates:
        if not path.is_file():
            continue
        try:
            rec = BuildRecord.from_json(json.loads(path.read_text()))
        except (ValueError, TypeError):
            continue
        if rec.content != inputs.content or not dockerapi.image_exists(rec.tag):
            continue
        if dockerapi.inspect(rec.tag)["Id"] != rec.image_id:
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


def changed_parts(ws: Workspace, record: BuildRecord | None, inputs: Inputs, *, recipes: bool = True) -> list[str]:
    """What differs between the recorded image and the workspace, by name: dockerfile, lock,
    base, runtime, and each recipe folder that changed (only when recipes count). Empty when the
    image is current."""
    if record is None:
        return []
    if record.content == inputs.content:
        return []
    old = record.extra.get("parts") or {}
    if not old:
        return ["its inputs (the record predates per-part digests)"]
    now = inputs.parts()
    names = [k for k in ("dockerfile", "lock", "base", "runtime") if old.get(k) != now[k]]
    if recipes and old.get("recipes") != now["recipes"]:
        from launcher.images import recipelayer

        before = record.extra.get("recipes") or {}
        after = recipelayer.recipe_digests(ws.recipes)
        changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
        names += [f"recipe {n}" for n in changed] or ["recipes/"]
    return names


def ask_ahead(ws: Workspace, variant: str) -> None:
    """Ask the engine now for the recorded image of variant, which ensure_current checks next (Engine.ask_image;
    only in a memo.kept() block): a run asks while it lists its code."""
    record = read_record(ws, variant)
    if record is not None:
        engine.local().ask_image(record.image_id)


def ensure_current(ws: Workspace, variant: str, *, recipes: bool = True, allow_build: bool = True,
                   find_links: Sequence[Path] = (), ca_bundle: Path | None = None,
                   reporter: Reporter | None = None) -> BuildRecord:
    """The workspace's image of variant, built first when missing or out of date (recipes: the
    run executes the baked recipes, so they must be current too). allow_build=False refuses
    instead of building: a run never executes code other than the workspace's, silently."""
    rep = reporter or NullReporter()
    inputs = gather(ws, variant)
    record = read_record(ws, variant)
    changed = changed_parts(ws, record, inputs, recipes=recipes)
    if record is not None and not changed:
        # through the docker CLI, as the run goes on: docker-py would cost its import, a quarter of a second
        if engine.local().holds_image(record.image_id):
            return record
        why = f"the {variant} image {record.image_id[7:19]} is gone from the Docker engine"
    elif record is None:
        why = f"no {variant} image has been built in this workspace"
    else:
        why = f"the {variant} image is out of date: {', '.join(changed)} changed since it was built"
    if not allow_build:
        raise ImageOutOfDate(why, f"run `launcher build --variant {variant}` (a recipe edit takes seconds), or drop "
                             "--no-build to let run build it")
    rep.note(f"{why}; building it first")
    return build(ws, variant, find_links=find_links, ca_bundle=ca_bundle, reporter=rep)


def _ensure_base(pin: images.BasePin) -> None:
    """The pinned base in the local engine, pulled when it is not there; HostUnreachable or NotFound when it
    cannot be (pins.base_pull_failed)."""
    if dockerapi.image_exists(pin.ref):
        return
    pulled = engine.local().pull(pin.ref)
    if pulled.returncode != 0:
        raise images.base_pull_failed(pin, pulled.err, pulled.last_error_line())
    dockerapi.inspect(pin.ref)  # raises when the pulled image cannot be read
