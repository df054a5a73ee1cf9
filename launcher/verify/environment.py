"""The environment diff: the manifest fields that can explain a difference between two runs,
flattened to dotted keys and sorted into input, environment and info categories."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from launcher.records.manifest import Manifest


class EnvironmentRow(TypedDict):
    """One row of an explanation's ``environment``: a flattened manifest key whose value differs."""

    key: str
    category: str  # code | data | seed | params | hardware | software | info
    reference: object  # the manifests' values (any JSON value; None where the key is absent)
    run: object


# Flattened manifest keys -> category. Categories "code", "data", "seed" and "params" are
# inputs; "hardware" and "software" are the environment; "info" never explains a difference.
_EXACT_CATEGORY = {
    # The code digest is computed inside the container from what ran: it is the code's identity.
    # How the code got there (baked or mounted) and the git state around it are context.
    "recipe.tree_digest": "code", "recipe.lib_digest": "code", "recipe.entry": "code", "recipe.framework": "software",
    "recipe.code_source": "info", "recipe.files": "info", "recipe.args": "params", "recipe.volatile": "info",
    "image.git_commit": "info", "image.git_dirty": "info", "image.runtime_digest": "software",
    "image.packages_digest": "software",
    "seed": "seed",
    "image.id": "software", "image.base_digest": "software", "image.lock_sha256": "software",
    "image.variant": "hardware", "image.launcher_version": "software", "image.tag": "info",
    "determinism.profile": "software", "determinism.threads": "software",
    "host.name": "info", "host.kind": "info",
    "determinism.env.LAUNCHER_TRACE_EVERY": "info",  # what is recorded, not what is computed
    "determinism.env.LAUNCHER_OPTRACE": "info",
    # where checkpoints are written and whether the run starts from one: training's bits are the same
    "determinism.env.LAUNCHER_CHECKPOINT_EVERY": "info", "determinism.env.LAUNCHER_CHECKPOINT_KEEP": "info",
    "determinism.env.LAUNCHER_RESUME": "info",
}
_SEED_ENV = ("LAUNCHER_SEED", "PYTHONHASHSEED")
_HARDWARE_WORDS = ("cpu", "gpu", "driver", "cuda", "cudnn", "device", "arch", "machine", "cores", "nproc",
                   "isa")
# Host facts that describe access and capacity, not what computes the bits.
_INFO_FACTS = ("user", "is_root", "sudo", "systemd", "docker", "ram_bytes", "disk", "root_dir", "container_toolkit",
               "nvidia.smi")
_VOLATILE_WORDS = ("time", "_at", "date", "uptime", "free", "avail", "load", "pid", "hostname", "boot",
                   "container", "run_id", "elapsed", "duration")


# The flattened view holds the manifest's values as they are: any JSON value (a leaf, a list, {}).
def _flatten(prefix: str, value: object, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value:
        for k in sorted(value):
            _flatten(f"{prefix}.{k}" if prefix else str(k), value[k], out)
    else:
        out[prefix] = value


def environment_view(m: Manifest) -> dict[str, Any]:
    """The manifest fields that can explain a difference, flattened to dotted keys (their values
    as the manifest holds them: any JSON value)."""
    flat: dict[str, Any] = {}
    for key in ("recipe", "image", "determinism", "host", "runtime", "params"):
        if key in m.data:
            _flatten(key, m.data[key], flat)
    flat["seed"] = m.seed
    _flatten("topology", topology_view(m), flat)
    flat.pop("recipe.name", None)
    # a param is the user's input whatever its name (a `decay_at`, a `start_time` is no timestamp of the run)
    return {k: v for k, v in flat.items() if k.startswith("params.") or not _is_volatile_key(k)}


# What of a run's topology computes its bits (its layout, backend and collective settings), and the layout of a
# run of one process, so that one compared with a run of several names the fields that differ.
TOPOLOGY_KEYS = ("nodes", "procs_per_node", "world_size", "backend", "launcher", "ranks", "collectives")
ONE_PROCESS = {"nodes": 1, "procs_per_node": 1, "world_size": 1}


def topology_view(m: Manifest) -> dict[str, Any]:
    """The manifest's topology as an environment: the layout and the collectives (not where each node ran, nor how
    its ranks ended); a run of one process as one node of one process."""
    recorded: Mapping[str, Any] | None = m.data.get("topology")
    if not isinstance(recorded, Mapping):
        return dict(ONE_PROCESS)
    return {k: recorded[k] for k in TOPOLOGY_KEYS if k in recorded}


def _is_volatile_key(key: str) -> bool:
    leaf = key.rsplit(".", 1)[-1].lower()
    return any(w in leaf for w in _VOLATILE_WORDS)


def categorize(key: str) -> str:
    if key in _EXACT_CATEGORY:
        return _EXACT_CATEGORY[key]
    if key.startswith("params."):
        return "params"
    if key.startswith("topology."):  # where and how the ranks compute, as the hardware is
        return "hardware"
    if key.startswith("recipe.git."):
        return "info"
    if key.startswith(("determinism.env.", "runtime.env.")):
        return "seed" if key.rsplit(".", 1)[-1] in _SEED_ENV else "software"
    if key == "runtime.seed":
        return "seed"
    if key.startswith("host.") and not key.startswith("host.facts."):
        return "info"
    lower = key.lower()
    if key.startswith("host.facts.") and any(w in lower for w in _INFO_FACTS):
        return "info"
    if key.startswith(("host.facts.", "runtime.")) and any(w in lower for w in _HARDWARE_WORDS):
        return "hardware"
    return "software"


def environment_diff(ref: Manifest, run: Manifest) -> list[EnvironmentRow]:
    a, b = environment_view(ref), environment_view(run)
    rows: list[EnvironmentRow] = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            rows.append({"key": key, "category": categorize(key), "reference": a.get(key), "run": b.get(key)})
    return rows
