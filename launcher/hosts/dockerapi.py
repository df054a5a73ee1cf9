"""The local Docker engine's API through docker-py: the builder's classic build (which the docker CLI does not
offer without BuildKit), and the look-ups and removals of the images a build makes and replaces.

With :mod:`launcher.hosts.engine` (every other Docker operation, on any host, through the docker CLI), the only
module that speaks to Docker; docker-py is imported here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from launcher.errors import BuildFailed, EngineUnavailable, NotFound, plain_text


@lru_cache(maxsize=1)
def client() -> Any:
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - docker is a declared dependency
        raise EngineUnavailable("the docker Python package is not installed", "pip install docker") from exc
    try:
        c = docker.from_env(timeout=600)
        c.ping()
        return c
    except Exception as exc:
        raise EngineUnavailable(
            f"no Docker engine answers ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})",
            "start it (`dockerd &` or `systemctl start docker`) or set DOCKER_HOST",
        ) from exc


def _errors() -> Any:
    import docker.errors

    return docker.errors


def require() -> dict[str, Any]:  # Docker's `info`, its schema Docker's
    """The local engine's info (EngineUnavailable when none answers)."""
    info: dict[str, Any] = client().info()
    return info


def inspect(ref: str) -> dict[str, Any]:  # Docker's image JSON, its schema Docker's
    try:
        attrs: dict[str, Any] = client().api.inspect_image(ref)
        return attrs
    except _errors().ImageNotFound as exc:
        raise NotFound(f"image {ref} is not in the local Docker engine", "build it with `launcher build`") from exc


def image_exists(ref: str) -> bool:
    try:
        client().api.inspect_image(ref)
        return True
    except _errors().ImageNotFound:
        return False


def remove_image(ref: str) -> None:
    try:
        client().api.remove_image(ref, force=True, noprune=False)
    except _errors().ImageNotFound:
        pass


def tagged_id(ref: str) -> str | None:
    """The ID of the image ref names in the local engine, or None."""
    try:
        return str(client().api.inspect_image(ref)["Id"])
    except _errors().ImageNotFound:
        return None


def remove_unreferenced(image_ids: Iterable[str], *, launcher_only: bool = False) -> list[str]:
    """Remove each image that no tag names and no other image or container uses, children first (the
    order given, reversed); leave the rest. launcher_only: only images launcher labelled (org.launcher.*).
    The removed IDs. Never a parent's cascade: only the images named here go."""
    errors = _errors()
    removed = []
    for image_id in reversed(list(dict.fromkeys(image_ids))):
        try:
            attrs = client().api.inspect_image(image_id)
        except errors.ImageNotFound:
            continue
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        if attrs.get("RepoTags") or attrs.get("RepoDigests"):
            continue
        if launcher_only and not any(k.startswith("org.launcher.") for k in labels):
            continue
        try:
            client().api.remove_image(attrs["Id"], force=False, noprune=True)
            removed.append(attrs["Id"])
        except errors.APIError:
            continue  # a child image or a container still uses it: not unreferenced after all
    return removed


def build(context: Path, *, dockerfile: str, tag: str | None, buildargs: Mapping[str, str],
          labels: Mapping[str, str], nocache: bool) -> Iterator[dict[str, Any]]:  # Docker's build events
    """Stream the local engine's build events; the last one carries {"aux": {"ID": ...}}.

    The build has no network: everything it installs comes from the wheelhouse.
    """
    try:
        yield from client().api.build(
            path=str(context), dockerfile=dockerfile, tag=tag, buildargs=dict(buildargs),
            labels=dict(labels), nocache=nocache, rm=True, forcerm=True, pull=False, decode=True,
            network_mode="none",
        )
    except _errors().APIError as exc:
        raise BuildFailed(f"the Docker engine refused the build: {plain_text(str(exc.explanation or exc))}",
                          "check the Dockerfile and the base image") from exc
