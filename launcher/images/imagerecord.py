"""What launcher knows of an image it built, by image ID: its config as kept in the layer cache
(``images/configs/<id>.json``, whose sha256 *is* the ID), the labels the build put there, and the
recipes layer's files (the image's last layer, ``images/layers/<diff id>.tar``).

A run's manifest names its image by ID; this is how a proof of the run finds what built it (the
base reference, the lock, the runtime, the Dockerfile's part through ``org.launcher.env-content``,
the recipes as baked) without trusting the workspace as it is now.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from launcher.errors import Corrupt
from launcher.images import tree as imagetree
from launcher.images.recipelayer import IMAGE_RECIPES

LABEL = "org.launcher."


@dataclass(frozen=True)
class BuiltImage:
    image_id: str
    config: bytes
    recipes_layer: Path | None  # the last layer's tar in the cache, when it is there

    @property
    def data(self) -> imagetree.ImageConfig:
        data: imagetree.ImageConfig = json.loads(self.config)  # its sha256 is the image ID: launcher wrote it
        return data

    @property
    def labels(self) -> dict[str, str]:
        return dict((self.data.get("config") or {}).get("Labels") or {})

    def label(self, name: str) -> str | None:
        return self.labels.get(LABEL + name)

    @property
    def base_ref(self) -> str | None:
        return self.label("base")

    @property
    def git(self) -> tuple[str, bool]:
        """The (commit, dirty) the build labelled it with: a rebuild elsewhere must use the same."""
        return self.label("git-commit") or "unknown", self.label("git-dirty") == "true"

    @property
    def epoch(self) -> int:
        """The build epoch: every date in the image (the recipes layer's history entry carries it)."""
        history = self.data.get("history") or []
        stamp = str(history[-1].get("created", "")) if history else ""
        try:
            return calendar.timegm(time.strptime(stamp, imagetree.STAMP_FORMAT))
        except ValueError:
            return imagetree.DEFAULT_EPOCH


def find(cache_dir: Path, image_id: str) -> BuiltImage | None:
    """The image as this machine's layer cache holds it, or None (built elsewhere, or pruned)."""
    path = cache_dir / "images" / "configs" / f"{image_id.removeprefix('sha256:')}.json"
    try:
        config = path.read_bytes()
    except OSError:
        return None
    if "sha256:" + hashlib.sha256(config).hexdigest() != image_id:
        return None
    diff_ids = json.loads(config).get("rootfs", {}).get("diff_ids") or []
    layer = cache_dir / "images" / "layers" / f"{str(diff_ids[-1]).removeprefix('sha256:')}.tar" if diff_ids else None
    return BuiltImage(image_id, config, layer if layer is not None and layer.is_file() else None)


def extract_recipes(layer: Path, into: Path) -> int:
    """Write the recipes a recipes layer holds (``opt/launcher/recipes/...``) into the folder into, keeping
    the executable bit (the layer's modes come from it); returns the number of files."""
    prefix = PurePosixPath(IMAGE_RECIPES)
    count = 0
    into.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(layer, mode="r:") as tar:
            for member in tar:
                name = PurePosixPath(member.name.lstrip("./"))
                if not member.isfile() or prefix not in name.parents:
                    continue
                rel = name.relative_to(prefix)
                if ".." in rel.parts:
                    raise Corrupt(f"{layer}: the entry {member.name} leaves the recipes folder",
                                  "prune the cache (`launcher cache prune`) and build again")
                target = into.joinpath(*rel.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                assert src is not None
                with src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                target.chmod(0o755 if member.mode & 0o100 else 0o644)
                count += 1
    except (OSError, tarfile.TarError) as exc:
        raise Corrupt(f"cannot read the recipes layer {layer}: {exc}",
                      "prune the cache (`launcher cache prune`) and build again") from None
    return count
