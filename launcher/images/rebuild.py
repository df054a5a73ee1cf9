"""`launcher rebuild --verify`: the image built again from scratch and compared with the recorded build of the
workspace's inputs as they are now (the last build, or an earlier build of the same inputs this machine keeps by
content), by filesystem tree and image ID."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import ImageOutOfDate, LauncherError, NotFound
from launcher.images.build import LABEL, PACKAGE_DIR, Inputs, build, cached_record, gather
from launcher.images.buildrecord import DEFAULT_EPOCH, BuildRecord, read_record
from launcher.progress import Reporter
from launcher.workspace import Workspace


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


def _build_of(ws: Workspace, inputs: Inputs) -> tuple[BuildRecord, Path] | None:
    """The recorded build of exactly these inputs and the path of its saved tree: the workspace's last build when
    it was of them, else the one this machine keeps by content (an earlier build of the same inputs)."""
    for path in (ws.build_record(inputs.variant), cached_record(ws, inputs)):
        tree = path.with_suffix(".tree.json.gz")
        if not (path.is_file() and tree.is_file()):
            continue
        try:
            rec = BuildRecord.from_json(json.loads(path.read_text()))
        except (ValueError, TypeError):
            continue
        if rec.content == inputs.content:
            return rec, tree
    return None


def changed_files(ws: Workspace, record: BuildRecord, inputs: Inputs) -> list[str]:
    """The workspace's files that differ from what the recorded build was made of, by path (a recipe file with
    what happened to it), for an image that is not of the workspace's inputs any more."""
    from launcher.images import recipelayer
    from launcher.images import tree as imagetree

    old = record.extra.get("parts") or {}
    now = inputs.parts()
    sources = {"dockerfile": inputs.dockerfile, "lock": inputs.lockfile, "base": ws.images_lock,
               "runtime": PACKAGE_DIR / "runtime"}
    names = [_rel(ws, sources[k]) for k in ("dockerfile", "lock", "base", "runtime") if old.get(k) != now[k]]
    if old.get("recipes") == now["recipes"]:
        return names
    tree_path = ws.build_record(inputs.variant).with_suffix(".tree.json.gz")
    prefix = recipelayer.IMAGE_RECIPES + "/"
    def files(tree: dict[str, str]) -> dict[str, str]:  # a folder's own line changes with nothing inside it
        return {p: line for p, line in tree.items() if p.startswith(prefix) and not line.startswith("d ")}

    before = files(imagetree.load_tree(tree_path)) if tree_path.is_file() else {}
    after = files(recipelayer.tree_lines(ws.recipes, int(record.extra.get("epoch", DEFAULT_EPOCH))))
    names += [f"recipes/{c['path'].removeprefix('/' + prefix)} ({c['change']})"
              for c in imagetree.diff_trees(before, after)]
    return names or ["recipes/"]


def _rel(ws: Workspace, path: Path) -> str:
    try:
        return str(path.relative_to(ws.root))
    except ValueError:
        return str(path)


def rebuild(ws: Workspace, variant: str = "cpu", *, verify: bool = True, ca_bundle: Path | None = None,
            find_links: Sequence[Path] = (), reporter: Reporter | None = None) -> RebuildReport:
    """Rebuild from scratch (no cache) and compare with the recorded build of the workspace's inputs as they are
    now (the last build, or an earlier build of the same inputs this machine keeps by content). When nothing was
    built from them, the workspace changed since its last build: ImageOutOfDate names the files, as no rebuild
    could prove anything about them."""
    from launcher.images import tree as imagetree

    started = time.monotonic()
    reference = _build_of(ws, gather(ws, variant)) if verify else None
    if verify and reference is None:
        raise _no_build_to_verify(ws, variant)
    record = reference[0] if reference else read_record(ws, variant)
    epoch = int(record.extra.get("epoch", DEFAULT_EPOCH)) if record else DEFAULT_EPOCH
    # A verifying rebuild needs only the digests of the normalised image, not the image itself.
    git = None
    if record is not None:
        git = (record.labels.get(LABEL + "git-commit", "unknown"), record.labels.get(LABEL + "git-dirty") == "true")
    fresh = build(ws, variant, nocache=True, ca_bundle=ca_bundle, find_links=find_links, epoch=epoch,
                  write_record=not verify, keep_image=not verify, git=git if verify else None, reporter=reporter)
    if reference is None:
        return RebuildReport(variant, fresh.image_id, fresh.image_id, fresh.tree_digest, fresh.tree_digest, [],
                             round(time.monotonic() - started, 2))
    recorded, tree_path = reference
    changes = imagetree.diff_trees(imagetree.load_tree(tree_path), fresh.extra["tree"]) \
        if fresh.tree_digest != recorded.tree_digest else []
    return RebuildReport(variant, recorded.image_id, fresh.image_id, recorded.tree_digest, fresh.tree_digest, changes,
                         round(time.monotonic() - started, 2))


def _no_build_to_verify(ws: Workspace, variant: str) -> LauncherError:
    last = read_record(ws, variant)
    if last is None:
        return NotFound(f"no recorded build of the {variant} image to verify against",
                        f"run `launcher build --variant {variant}` first")
    files = changed_files(ws, last, gather(ws, variant))
    return ImageOutOfDate(
        f"the workspace changed since the last build of the {variant} image ({', '.join(files)}): nothing was "
        "built from its inputs as they are now, so there is no build to verify against",
        f"revert the change to verify the last build, or build it first (`launcher build --variant {variant}`) "
        f"and then `launcher rebuild {variant} --verify`")
