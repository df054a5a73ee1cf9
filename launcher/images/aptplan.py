"""What apt's answer means: the driver's output (launcher.images.aptdriver, run inside the base image)
parsed into the exact .deb set of a system lock, every package cross-checked between apt's install plan
(`apt-get install -s`), its download list (`--print-uris`) and the archive's Packages index
(`apt-cache show`), or one readable LockFailed naming the package and apt's reason."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NotRequired, TypedDict
from urllib.parse import unquote

from launcher.errors import LockFailed, plain_text

INST = re.compile(r"^Inst (?P<name>[^\s:]+)(?::(?P<qual>\S+))? (?:\[(?P<old>[^\]]*)\] )?"
                  r"\((?P<version>\S+)[^\[]*\[(?P<arch>[^\]]+)\]\)", re.M)
REMV = re.compile(r"^Remv (\S+)", re.M)
URI = re.compile(r"^'(?P<url>[^']+)' (?P<file>\S+) (?P<size>\d+) (?P<hash>\S*)$", re.M)
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_E = re.compile(r"^E: (.*)$", re.M)
_UPDATE_FAILED = re.compile(r"^(?:Err:\d+ .*\n\s+(?P<why>.+)|W: Failed to fetch \S+\s+(?P<why2>.+))$", re.M)



class AptAnswer(TypedDict):
    """The apt driver's answer (images/aptdriver.py, after its MARKER): the base's facts, and the
    output of each apt stage run, up to the one that failed (``stage``) or all of them (``ok``)."""

    ok: bool
    os_release: str
    debian_version: str
    links: dict[str, str]  # a merged /usr's top-level links: bin -> usr/bin, ...
    arch: str
    update: str
    stage: NotRequired[str]  # update, simulate, uris or show: the one that failed
    sources: NotRequired[str]
    simulate: NotRequired[str]
    uris: NotRequired[str]
    show: NotRequired[str]
    installed: NotRequired[str]

@dataclass(frozen=True)
class DebPackage:
    """One .deb of a lock: what apt installs, where the archive serves it, and its Packages-index hash."""

    name: str
    version: str
    architecture: str
    url: str
    size: int
    sha256: str  # "sha256:<hex>", as the archive's Packages index lists it
    base_version: str | None = None  # the version the base has, when this one replaces it

    @property
    def filename(self) -> str:
        """apt's own name for the file: NAME_VERSION_ARCH.deb (an epoch's ':' written %3a)."""
        return f"{self.name}_{self.version.replace(':', '%3a')}_{self.architecture}.deb"

    def record(self) -> dict[str, str]:
        """What a run's manifest keeps of it."""
        return {"name": self.name, "version": self.version, "architecture": self.architecture,
                "sha256": self.sha256}


@dataclass(frozen=True)
class BaseFacts:
    """The base image as apt sees it."""

    debian: str  # /etc/debian_version, e.g. "12.15"
    codename: str  # VERSION_CODENAME of /etc/os-release, e.g. "bookworm"
    architecture: str  # dpkg's, e.g. "amd64"
    sources: tuple[str, ...]  # the base's Packages indexes: "SITE RELEASE COMPONENT ARCH"
    links: dict[str, str]  # top-level folders that are links in the base (merged /usr): {"lib": "usr/lib"}

    def describe(self) -> str:
        return f"Debian {self.debian} ({self.codename or 'unknown'}, {self.architecture})"


def facts(answer: AptAnswer) -> BaseFacts:
    release = dict(re.findall(r'^([A-Z_]+)="?([^"\n]*)"?$', str(answer.get("os_release", "")), re.M))
    sources = tuple(sorted({ln.strip() for ln in str(answer.get("sources", "")).splitlines() if ln.strip()}))
    links = {str(k): str(v).strip("/") for k, v in dict(answer.get("links") or {}).items()}
    return BaseFacts(str(answer.get("debian_version", "")).strip(), release.get("VERSION_CODENAME", ""),
                     str(answer.get("arch", "")).strip(), sources, dict(sorted(links.items())))


def parse_index(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """`apt-cache show` stanzas by (package, version): each field's first line."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    for stanza in re.split(r"\n\s*\n", text):
        fields = dict(re.findall(r"^([A-Za-z0-9-]+): ?(.*)$", stanza, re.M))
        if "Package" in fields and "Version" in fields:
            out[(fields["Package"], fields["Version"])] = fields
    return out


def apt_reason(output: str) -> str:
    """apt's own reason, in one line: its E: lines, with the unmet dependencies it lists before them."""
    text = plain_text(output)
    unmet = [" ".join(ln.split()) for ln in text.splitlines() if re.match(r"^\s+\S+ : \S", ln)]
    errors = [e.strip() for e in _E.findall(text)]
    reason = "; ".join(unmet + errors) or next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()),
                                               "apt gave no reason")
    return reason[:600]


def failure(answer: AptAnswer, requested: tuple[str, ...], where: str, base: BaseFacts) -> LockFailed:
    """The error of a resolution that did not succeed, naming the package apt could not find."""
    unreachable = update_failure(answer)
    fix_names = f"fix the name or version in {where} (`apt-cache search WORD` in the base image lists names)"
    if unreachable is not None:
        return LockFailed(f"apt-get update inside the base image could not reach its sources "
                          f"({', '.join(base.sources) or 'its apt sources'}): {unreachable}",
                          "`launcher lock` needs the Debian archive (http); check the network, or set "
                          "http_proxy for the container")
    stage = str(answer.get("stage", ""))
    output = str(answer.get(stage, "")) if stage else ""
    text = plain_text(output)
    where_found = f"the base's {base.describe()} sources"
    if m := re.search(r"^E: Unable to locate package (\S+)", text, re.M):
        return LockFailed(f"OS package {m.group(1)} cannot be resolved: there is no such package in {where_found}",
                          fix_names)
    if m := re.search(r"^E: Version '([^']+)' for '([^']+)' was not found", text, re.M):
        return LockFailed(f"OS package {m.group(2)}={m.group(1)} cannot be resolved: {where_found} have no version "
                          f"{m.group(1)} of it", f"drop the pin or pin a version the archive has; {fix_names}")
    if m := re.search(r"^E: Package '([^']+)' has no installation candidate", text, re.M):
        providers = re.findall(r"^  (\S+) \S+$", text, re.M)
        also = f" (provided by: {', '.join(providers[:8])})" if providers else ""
        return LockFailed(f"OS package {m.group(1)} cannot be resolved: it is a virtual or obsolete package with "
                          f"nothing to install{also}", f"name the real package instead; {fix_names}")
    return LockFailed(f"OS packages {' '.join(requested)} cannot be resolved together in {where_found}: "
                      f"{apt_reason(output)}", f"change the packages or pins in {where}")


def update_failure(answer: AptAnswer) -> str | None:
    """Why apt-get update could not fetch the indexes (it exits 0 after mere warnings), or None."""
    text = plain_text(str(answer.get("update", "")))
    m = _UPDATE_FAILED.search(text)
    if m is None:
        return None if answer.get("stage") != "update" else apt_reason(text)
    return (m.group("why") or m.group("why2") or "").strip()


def _inst(text: str, native: str) -> tuple[list[tuple[str, str, str, str | None]], list[str]]:
    installs = []
    for m in INST.finditer(text):
        qual = m.group("qual")
        if qual and qual != native:
            raise LockFailed(f"apt planned {m.group('name')}:{qual}, a package of a foreign architecture",
                             "launcher locks packages of the base's own architecture only")
        installs.append((m.group("name"), m.group("version"), m.group("arch"), m.group("old")))
    return installs, REMV.findall(text)


def plan(answer: AptAnswer, requested: tuple[str, ...], where: str) -> tuple[BaseFacts, list[DebPackage],
                                                                                 list[str]]:
    """The base's facts, the .debs (sorted by name) and the requested packages the base already has
    ("NAME=VERSION"), from a successful driver answer. Every planned package must appear, with the same
    size and hash, in apt's download list and in the archive's Packages index; else LockFailed."""
    base = facts(answer)
    if not answer.get("ok"):
        raise failure(answer, requested, where, base)
    installs, removals = _inst(plain_text(str(answer.get("simulate", ""))), base.architecture)
    if removals:
        raise LockFailed(f"installing {' '.join(requested)} would remove {', '.join(sorted(removals))} from the base "
                         "image, and a project layer only adds files", f"choose packages that fit the base; {where}")
    uris = {m.group("file"): m for m in URI.finditer(str(answer.get("uris", "")))}
    index = parse_index(str(answer.get("show", "")))
    debs: list[DebPackage] = []
    for name, version, arch, old in installs:
        filename = f"{name}_{version.replace(':', '%3a')}_{arch}.deb"
        uri = uris.pop(filename, None)
        fields = index.get((name, version))
        if uri is None or fields is None:
            missing = "apt printed no download for it" if uri is None else "the archive's index does not list it"
            raise LockFailed(f"apt plans to install {name} {version} but {missing}",
                             "run `launcher lock` again; if it persists, the base's apt sources are inconsistent")
        debs.append(_checked(name, version, arch, old, uri, fields))
    if uris:
        raise LockFailed(f"apt would download {', '.join(sorted(uris))} without planning to install it",
                         "run `launcher lock` again; if it persists, report it")
    planned = {d.name for d in debs}
    in_base = [f"{name}={version}" for name, version, status in _installed(str(answer.get("installed", "")))
               if status.startswith("ii") and name not in planned]
    return base, sorted(debs, key=lambda d: (d.name, d.architecture)), sorted(in_base)


def _checked(name: str, version: str, arch: str, old: str | None, uri: re.Match[str],
             fields: dict[str, str]) -> DebPackage:
    """One planned .deb, its download and its index record agreeing on architecture, file, size and hash."""
    url, size, printed = uri.group("url"), int(uri.group("size")), uri.group("hash")
    sha = fields.get("SHA256", "").lower()
    problems = []
    if not SHA256_HEX.match(sha):
        problems.append("the index lists no SHA256")
    if fields.get("Architecture") != arch:
        problems.append(f"architecture {fields.get('Architecture')} in the index, {arch} in the plan")
    if fields.get("Size", "") != str(size):
        problems.append(f"size {fields.get('Size')} in the index, {size} to download")
    if not unquote(url).endswith("/" + fields.get("Filename", "?")):
        problems.append(f"file {fields.get('Filename')} in the index, {url} to download")
    algo, _, value = printed.partition(":")
    index_field = {"SHA256": "SHA256", "MD5Sum": "MD5sum", "SHA512": "SHA512", "SHA1": "SHA1"}.get(algo)
    if index_field and fields.get(index_field, "").lower() != value.lower():
        problems.append(f"{algo} {value[:16]}... to download, {fields.get(index_field, 'none')[:16]}... in the index")
    if problems:
        raise LockFailed(f"apt's download of {name} {version} disagrees with the archive's Packages index: "
                         f"{'; '.join(problems)}", "run `launcher lock` again; if it persists, the mirror is "
                         "inconsistent or tampered with")
    return DebPackage(name, version, arch, url, size, "sha256:" + sha, (old.split()[0] if old else None))


def _installed(text: str) -> list[tuple[str, str, str]]:
    rows = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[1]:
            rows.append((parts[0], parts[1], parts[2].strip()))
    return rows
