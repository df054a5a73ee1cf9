"""An image reference, parsed: [registry/]repository[:tag][@digest], as docker reads it. A value of its own,
without the network (launcher.images.registry talks to the registry it names)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.errors import UsageError

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class ImageRef:
    """A parsed reference: [registry/]repository[:tag][@digest]."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, ref: str) -> ImageRef:
        text = ref.strip()
        if not text or any(c.isspace() for c in text):
            raise UsageError(f"not an image reference: {ref!r}", "use NAME[:TAG][@sha256:DIGEST]")
        name, _, digest = text.partition("@")
        if digest and not DIGEST_RE.match(digest):
            raise UsageError(f"malformed digest in {ref!r}", "a digest is sha256: followed by 64 hex digits")
        tag = None
        last = name.rsplit("/", 1)[-1]
        if ":" in last:
            name, tag = name.rsplit(":", 1)
        parts = name.split("/", 1)
        if len(parts) == 2 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
            registry, repo = parts
            if registry == "index.docker.io":  # docker's legacy name for Docker Hub
                registry = "docker.io"
        else:
            registry, repo = "docker.io", name
        if registry == "docker.io" and "/" not in repo:
            repo = f"library/{repo}"
        return cls(registry, repo, tag, digest or None)

    @property
    def short_name(self) -> str:
        if self.registry == "docker.io":
            return self.repository.removeprefix("library/")
        return f"{self.registry}/{self.repository}"

    def pinned(self, digest: str) -> str:
        tag = f":{self.tag}" if self.tag else ""
        return f"{self.short_name}{tag}@{digest}"

    @property
    def api_base(self) -> str:
        host = "registry-1.docker.io" if self.registry == "docker.io" else self.registry
        scheme = "http" if is_loopback(host) else "https"
        return f"{scheme}://{host}"


def is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name in ("localhost", "::1", "[::1]") or name.startswith("127.")
