"""The probe set's configuration: recipe.toml's ``[probes]`` table and ``launcher run --probes SPEC``.

Standard library only (the runtime inside the image reads it too). Both spellings go through
:func:`check_probes`, so a table and an option cannot disagree about what is allowed; a problem
raises :class:`ProbeError`, naming the key (``probes.count``) and what is wrong with it.

SPEC, the option's text: ``off`` (no probes), a whole number N (the first N examples of the
validation split), or comma-separated KEY=VALUE with the table's keys: ``count=8``,
``indices=0;3;7``, ``gradcam=true|false``, ``layer=NAME``, ``split=validation``,
``fingerprint=sha256:...``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.runtime.records import ProbeConfig

PROBE_KEYS = frozenset({"split", "count", "indices", "gradcam", "layer", "fingerprint"})
PROBE_SPLITS = ("validation",)
DEFAULT_PROBES = 16
OFF = "off"
# patterns compiled at first use (and cached by re): a plain script's run checks none
_DIGEST = r"^sha256:[0-9a-f]{64}$"


class ProbeError(ValueError):
    """A probe set that cannot be used: ``key`` is the offending key (``probes.count``) or None."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key
        self.detail = message


@dataclass(frozen=True)
class ProbeSpec:
    """The probe set: which held-out examples, and whether (and where) to compute Grad-CAM."""

    split: str = "validation"
    count: int = DEFAULT_PROBES
    indices: tuple[int, ...] = ()  # when given, these examples instead of the first ``count``
    gradcam: bool = True
    layer: str | None = None
    fingerprint: str | None = None

    def as_dict(self) -> ProbeConfig:
        return {"split": self.split, "count": self.count, "indices": list(self.indices), "gradcam": self.gradcam,
                "layer": self.layer, "fingerprint": self.fingerprint}


def _need(cond: bool, message: str, key: str | None = None) -> None:
    if not cond:
        raise ProbeError(message, key)


def check_probes(raw: Any) -> ProbeSpec:
    """A ``[probes]`` table (or the same keys from elsewhere) checked; raises ProbeError."""
    _need(isinstance(raw, dict), "must be a table ([probes])", "probes")
    unknown = sorted(set(raw) - PROBE_KEYS)
    _need(not unknown, f"unknown key (known: {', '.join(sorted(PROBE_KEYS))})",
          f"probes.{unknown[0]}" if unknown else None)
    split = raw.get("split", "validation")
    _need(split in PROBE_SPLITS, f"must be one of {', '.join(PROBE_SPLITS)}", "probes.split")
    _need(not ("count" in raw and "indices" in raw), "give count or indices, not both", "probes.indices")
    count = raw.get("count", DEFAULT_PROBES)
    _need(isinstance(count, int) and not isinstance(count, bool) and count >= 1,
          "must be a whole number >= 1", "probes.count")
    indices = raw.get("indices", [])
    _need(isinstance(indices, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                            for i in indices) and len(set(indices)) == len(indices),
          "must be a list of distinct example positions (whole numbers >= 0)", "probes.indices")
    _need("indices" not in raw or bool(indices), "must name at least one example", "probes.indices")
    gradcam = raw.get("gradcam", True)
    _need(isinstance(gradcam, bool), "must be true or false", "probes.gradcam")
    layer = raw.get("layer")
    _need(layer is None or (isinstance(layer, str) and bool(layer)), "must name a layer of the model",
          "probes.layer")
    fpr = raw.get("fingerprint")
    _need(fpr is None or (isinstance(fpr, str) and bool(re.match(_DIGEST, fpr))),
          "must look like sha256:<64 hex digits>", "probes.fingerprint")
    return ProbeSpec(split=split, count=len(indices) if indices else count, indices=tuple(indices),
                     gradcam=gradcam, layer=layer, fingerprint=fpr)


def _number(text: str) -> int | str:
    """A whole number written in the option (for the table's checks), else the text itself."""
    try:
        return int(text.strip())
    except ValueError:
        return text


OptionValue = int | str | bool | list[int | str]  # a --probes KEY=VALUE's value, as the table would hold it


def _value(key: str, text: str) -> OptionValue:
    """KEY=VALUE's value as the table would hold it; a value of the wrong kind stays text, so the
    table's check refuses it with the table's words."""
    text = text.strip()
    if key == "count":
        return _number(text)
    if key == "indices":
        return [_number(p) for p in text.split(";")] if text else []
    if key == "gradcam":
        word = text.lower()
        return True if word in ("true", "1", "yes", "on") else False if word in ("false", "0", "no", "off") \
            else text
    return text


def parse_option(spec: str) -> ProbeSpec | None:
    """``--probes SPEC`` as a probe set, or None for ``off``; raises ProbeError."""
    text = spec.strip()
    if text.lower() == OFF:
        return None
    _need(bool(text), "is empty")
    if "=" not in text:
        n = _number(text)
        _need(isinstance(n, int), f"{text!r} is neither off, a whole number nor KEY=VALUE pairs")
        return check_probes({"count": n})
    raw: dict[str, OptionValue] = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        _need(bool(eq) and bool(key), f"{item.strip()!r} is not KEY=VALUE (keys: {', '.join(sorted(PROBE_KEYS))})")
        _need(key not in raw, "given twice", f"probes.{key}")
        raw[key] = _value(key, value) if key in PROBE_KEYS else value
    return check_probes(raw)


def from_json(doc: Any) -> ProbeSpec:
    """The runtime's ``--probes JSON`` (a probe set's as_dict) checked again; raises ProbeError."""
    _need(isinstance(doc, dict), "must be a JSON object", "probes")
    raw = {k: v for k, v in doc.items() if v is not None and not (k == "indices" and not v)}
    if raw.get("indices"):
        raw.pop("count", None)
    return check_probes(raw)
