"""A minimal Debian + Python base image built from Debian packages, pushed to a
registry and pinned by digest: a base for machines without access to Docker Hub."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from launcher import proc
from launcher.errors import BuildFailed, NotFound, RegistryUnavailable, UsageError
from launcher.hashing import atomic_path
from launcher.hosts import dockerapi, engine
from launcher.hosts.containerspec import ContainerSpec
from launcher.images import registry
from launcher.images import tree as imagetree
from launcher.progress import NullReporter, Reporter

DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# The image's own interpreter says which Python it has (not a table of suites: any suite works).
PYTHON_PROBE = "import sys; print('launcher-python %d.%d' % sys.version_info[:2])"
_PROBED = re.compile(r"^launcher-python (\d+\.\d+)$", re.MULTILINE)


@dataclass(frozen=True)
class BootstrapResult:
    ref: str
    digest: str
    image_id: str
    python: str
    rootfs_cached: bool


def rootfs_key(suite: str, packages: tuple[str, ...], mirror: str) -> str:
    text = "\n".join([suite, mirror, *sorted(packages)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_rootfs_tar(cache_dir: Path, suite: str, packages: tuple[str, ...], mirror: str,
                     reporter: Reporter) -> tuple[Path, bool]:
    """debootstrap a rootfs and pack it as a tarball with sorted entries, cached by its inputs."""
    out = cache_dir / "bootstrap" / f"{suite}-{rootfs_key(suite, packages, mirror)}.tar"
    if out.is_file():
        return out, True
    if shutil.which("debootstrap") is None:
        raise NotFound("debootstrap is not installed", "apt-get install debootstrap")
    if os.geteuid() != 0:
        raise UsageError("debootstrap needs root", "run `launcher base bootstrap` as root (or with sudo)")
    task = reporter.task(f"debootstrap {suite} ({', '.join(packages)})")
    with tempfile.TemporaryDirectory(prefix="launcher-rootfs-") as tmp:
        root = Path(tmp) / "root"
        done = proc.run(["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite,
                         root, mirror], check=False)
        if done.returncode != 0:
            raise BuildFailed(f"debootstrap failed: {done.last_error_line()}",
                              "check the Debian mirror is reachable and the package names exist")
        # apt lists and logs only grow the layer and differ between bootstraps.
        for junk in ("var/lib/apt/lists", "var/cache/apt", "var/log"):
            shutil.rmtree(root / junk, ignore_errors=True)
            (root / junk).mkdir(parents=True, exist_ok=True)
        task.update(description="packing rootfs")
        with atomic_path(out) as tmp_tar:
            proc.run(["tar", "-C", root, "--sort=name", "--numeric-owner", "--mtime=@0",
                      "--clamp-mtime", "-cf", tmp_tar, "."])
    task.close()
    return out, False


def probed_python(output: str, tag: str, packages: tuple[str, ...]) -> str:
    """The image's Python (major.minor) from PYTHON_PROBE's output; a clear error when it has none."""
    m = _PROBED.search(output)
    if m is None:
        last = next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()), "no output")
        raise BuildFailed(f"the bootstrapped image {tag} has no working python3 ({last})",
                          f"include python3 in the packages (they were: {', '.join(packages)})")
    return m.group(1)


def bootstrap(
    cache_dir: Path,
    *,
    registry_address: str,
    name: str = "launcher-base",
    suite: str = DEFAULT_SUITE,
    packages: tuple[str, ...] = BASE_PACKAGES,
    mirror: str = DEFAULT_MIRROR,
    reporter: Reporter | None = None,
) -> BootstrapResult:
    rep = reporter or NullReporter()
    dockerapi.require()
    if not registry.ping(registry_address):
        raise RegistryUnavailable(f"no registry answers at {registry_address}",
                                  "start one with --start-registry, or pass --registry ADDR")
    tarball, cached = build_rootfs_tar(cache_dir, suite, packages, mirror, rep)
    tag = f"{registry_address}/{name}:{suite}"
    task = rep.task(f"importing and pushing {tag}")
    local = engine.local()
    imported = local.import_tar(tarball, tag, changes=['CMD ["python3"]'])
    if imported.returncode != 0:
        raise BuildFailed(f"docker import failed: {imported.last_error_line()}", "check the Docker engine")
    # `docker import` stamps the current time into the config; a fixed date makes the
    # same rootfs give the same image ID and so the same pinned digest.
    raw_id = imported.out.strip()
    norm = imagetree.normalize(raw_id, tag=tag)
    if norm.image_id != raw_id:
        dockerapi.remove_image(raw_id)
    probe = local.run_to_end(ContainerSpec(tag, ("python3", "-c", PYTHON_PROBE), network="none"))
    python = probed_python(probe.out + "\n" + probe.err, tag, packages)
    pushed = local.push(tag)
    if pushed.returncode != 0:
        raise RegistryUnavailable(f"docker push {tag} failed: {pushed.last_error_line()}",
                                  "check the registry is running and reachable from the Docker engine")
    digest = registry.resolve_digest(tag)
    image_id = dockerapi.inspect(tag)["Id"]
    task.close()
    return BootstrapResult(ref=f"{tag}@{digest}", digest=digest, image_id=image_id,
                           python=python, rootfs_cached=cached)
