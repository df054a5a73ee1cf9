"""Defaults a workspace keeps, so they need not be typed each time: `launcher.toml` at the workspace
root and `LAUNCHER_*` environment variables.

    # launcher.toml
    [defaults]
    host = "azure-gpu"        # --host: an SSH destination or alias; "local" is the local engine
    variant = "gpu"           # --variant
    determinism = "deterministic"  # --determinism
    threads = 4               # --threads (the deterministic profile's thread count; strict runs on 1)
    signing_key = "~/.ssh/id_ed25519"        # --key of attest, bundle, reproduce (SSH or PEM private key)

Precedence: the command line, then the environment (LAUNCHER_HOST, LAUNCHER_VARIANT,
LAUNCHER_DETERMINISM, LAUNCHER_THREADS), then the file, then launcher's built-in default.

Whom `attest verify` and `reproduce` trust (allowed_signers) is never a workspace's to say: a cloned
project could name an attacker's key as a colleague's. It comes from --allowed-signers, else
LAUNCHER_ALLOWED_SIGNERS, else the user's own ~/.config/launcher/allowed_signers ($XDG_CONFIG_HOME); a
launcher.toml that sets it is not read for it (`launcher config` says so). Each
setting is one row of SETTINGS: its key, its variable, the command-line parameter it is the default of
(in every command that has one of that name) and its check. A later default (a cluster's partition, a
VM's size) is one more row; defaults that are not an option's get a table of their own beside
[defaults].
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import tomllib

from launcher.determinism import DEFAULT_PROFILE, PROFILES, default_threads
from launcher.errors import BadConfig
from launcher.workspace import VARIANTS, Workspace, user_allowed_signers

FILE = "launcher.toml"
PROJECT_TABLE = "system"  # a project's OS packages, when the workspace is also the project (images/aptlock.py)
TABLE = "defaults"


SettingValue = str | int | None  # a host, variant, profile or path; a thread count; None: no built-in default


class _Bad(ValueError):
    """A value a setting refuses; the message says what a good one is."""


def _host(value: Any, ws: Workspace | None) -> str:
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        raise _Bad('an SSH destination (HOST, USER@HOST, USER@HOST:PORT or an alias) or "local"')
    return value


def _variant(value: Any, ws: Workspace | None) -> str:
    have = ws.variants() if ws is not None else VARIANTS
    if not isinstance(value, str) or value not in have:
        raise _Bad(f"one of the workspace's variants: {', '.join(have) or 'none yet'}")
    return value


def _determinism(value: Any, ws: Workspace | None) -> str:
    if not isinstance(value, str) or value not in PROFILES:
        raise _Bad(f"one of {', '.join(PROFILES)}")
    return value


def _threads(value: Any, ws: Workspace | None) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _Bad("a whole number of at least 1")
    return value


def _path(value: Any, ws: Workspace | None) -> str:
    """A file's path: ~ expanded, a relative one taken from the workspace's root (where launcher.toml is)."""
    if not isinstance(value, str) or not value.strip():
        raise _Bad("the path of a file, e.g. ~/.ssh/id_ed25519")
    path = Path(value).expanduser()
    if not path.is_absolute() and ws is not None:
        path = ws.root / path
    return str(path)


@dataclass(frozen=True)
class Setting:
    key: str  # in [defaults]
    env: str
    param: str  # the command-line parameter it is the default of
    builtin: SettingValue
    check: Callable[[Any, Workspace | None], str | int]
    help: str
    workspace: bool = True  # False: a trust root, never taken from a workspace's launcher.toml


SETTINGS: tuple[Setting, ...] = (
    Setting("host", "LAUNCHER_HOST", "host", "local", _host,
            "where runs go (--host): an SSH destination or alias, or local"),
    Setting("variant", "LAUNCHER_VARIANT", "variant", "cpu", _variant, "the image variant (--variant)"),
    Setting("determinism", "LAUNCHER_DETERMINISM", "determinism", DEFAULT_PROFILE, _determinism,
            "the determinism profile (--determinism)"),
    Setting("threads", "LAUNCHER_THREADS", "threads", default_threads(), _threads,
            "the deterministic profile's thread count (--threads)"),
    Setting("signing_key", "LAUNCHER_SIGNING_KEY", "key", None, _path,
            "the key attest, bundle and reproduce sign with (--key): an SSH or PEM private key"),
    Setting("allowed_signers", "LAUNCHER_ALLOWED_SIGNERS", "allowed_signers", None, _path,
            "whose signatures attest verify and reproduce accept (--allowed-signers): an allowed-signers file; "
            "from the environment or your own configuration, never a workspace's", workspace=False),
)
USER = "user configuration"  # a Value's source: the user's own file (~/.config/launcher/...)


class ValueRecord(TypedDict):
    """One setting as `launcher config` lists it: its value, where it came from, how to set it."""

    key: str
    value: SettingValue
    source: str
    origin: str
    env: str
    option: str
    help: str


@dataclass(frozen=True)
class Value:
    setting: Setting
    value: SettingValue
    source: str  # environment | file | user configuration | built-in
    origin: str  # LAUNCHER_HOST, /ws/launcher.toml, ~/.config/launcher/allowed_signers, or "launcher"

    def to_dict(self) -> ValueRecord:
        return {"key": self.setting.key, "value": self.value, "source": self.source, "origin": self.origin,
                "env": self.setting.env, "option": "--" + self.setting.param.replace("_", "-"),
                "help": self.setting.help}


class ConfigRecord(TypedDict):
    """The `config` command's Result data."""

    file: str | None
    file_exists: bool
    precedence: list[str]
    settings: list[ValueRecord]
    ignored: dict[str, str]  # a setting launcher.toml sets but may not (a trust root) -> why


@dataclass(frozen=True)
class Config:
    file: Path | None  # the workspace's launcher.toml, whether or not it exists (None outside a workspace)
    values: tuple[Value, ...]
    ignored: tuple[str, ...] = ()  # keys launcher.toml sets that a workspace may not (Setting.workspace False)

    def value(self, key: str) -> Value:
        return next(v for v in self.values if v.setting.key == key)

    def ignored_note(self, key: str) -> str | None:
        """Why launcher.toml's value of key is not used, when it sets one."""
        if key not in self.ignored:
            return None
        return (f"{self.file}'s {key} is not used: a workspace cannot choose whom its reviewer trusts "
                "(a cloned project could vouch for itself)")

    def defaults(self) -> dict[str, SettingValue]:
        """Parameter name -> the default it gets, for the settings set in the environment or the file."""
        return {v.setting.param: v.value for v in self.values if v.source != "built-in"}

    def to_dict(self) -> ConfigRecord:
        return {"file": str(self.file) if self.file else None,
                "file_exists": bool(self.file and self.file.is_file()),
                "precedence": ["command line", "environment", "file", "built-in"],
                "settings": [v.to_dict() for v in self.values],
                "ignored": {k: str(self.ignored_note(k)) for k in self.ignored}}


def read_file(path: Path, ws: Workspace | None) -> dict[str, str | int]:
    """The checked settings of a launcher.toml, by key; BadConfig names the file, the key and the fix."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadConfig(f"cannot read {path}: {exc.strerror or exc}", "make it a readable file, or remove it") \
            from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BadConfig(f"{path} is not valid TOML: {exc}",
                        f'write it as TOML, e.g. [{TABLE}] then variant = "cpu"') from None
    known = {s.key: s for s in SETTINGS}
    for key in data:
        if key != TABLE and key != PROJECT_TABLE:
            raise BadConfig(f"{path}: unknown key or table {key!r}",
                            f"put defaults under [{TABLE}]: {', '.join(known)}")
    table = data.get(TABLE, {})
    if not isinstance(table, dict):
        raise BadConfig(f"{path}: {TABLE} is not a table", f"write [{TABLE}] on a line of its own, then key = value")
    out: dict[str, str | int] = {}
    for key, raw in table.items():
        setting = known.get(key)
        if setting is None:
            raise BadConfig(f"{path}: unknown key {TABLE}.{key}", f"the keys of [{TABLE}] are {', '.join(known)}")
        try:
            out[key] = setting.check(raw, ws)
        except _Bad as exc:
            raise BadConfig(f"{path}: {TABLE}.{key} = {raw!r} is not allowed",
                            f"set {key} to {exc}, or remove the line") from None
    return out


def resolve(ws: Workspace | None, environ: Mapping[str, str] | None = None) -> Config:
    """Every setting's value and where it came from: environment, then the workspace's file, then built-in."""
    env = os.environ if environ is None else environ
    path = ws.root / FILE if ws is not None else None
    from_file = read_file(path, ws) if path is not None and path.is_file() else {}
    values = []
    mine = user_allowed_signers(env)
    for s in SETTINGS:
        raw = env.get(s.env)
        if raw is not None and raw != "":
            try:
                values.append(Value(s, s.check(raw, ws), "environment", s.env))
            except _Bad as exc:
                raise BadConfig(f"{s.env}={raw!r} is not allowed", f"set {s.env} to {exc}, or unset it") from None
        elif s.key in from_file and s.workspace:
            values.append(Value(s, from_file[s.key], "file", str(path)))
        elif s.key == "allowed_signers" and mine.is_file():
            values.append(Value(s, str(mine), USER, str(mine)))
        else:
            values.append(Value(s, s.builtin, "built-in", "launcher"))
    ignored = tuple(s.key for s in SETTINGS if not s.workspace and s.key in from_file)
    return Config(path, tuple(values), ignored)
