"""Model weights as named arrays in model order, and their numpy forms: the runtime's canonical.npz, .npy and .npz."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from launcher.errors import Corrupt, LauncherError, NotFound


@dataclass(frozen=True)
class WeightArray:
    layer: str
    array: str
    value: np.ndarray

    @property
    def key(self) -> tuple[str, str]:
        return (self.layer, self.array)


@dataclass
class Weights:
    """Arrays in model order (the order of the file)."""

    source: Path
    arrays: list[WeightArray]

    def __iter__(self) -> Iterator[WeightArray]:
        return iter(self.arrays)

    @property
    def parameter_count(self) -> int:
        return sum(int(a.value.size) for a in self.arrays)


def read_npy(data: bytes, name: str, source: Path) -> np.ndarray:
    try:
        arr = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise Corrupt(f"{source}: entry {name} is not a readable .npy array ({exc})",
                      "re-pull the run (`launcher pull RUN`)") from exc
    return arr


def _split_canonical(name: str) -> tuple[int, str, str] | None:
    if not name.endswith(".npy"):
        return None
    stem = name[: -len(".npy")]
    prefix, sep, index = stem.rpartition("/")
    order, dot, layer = prefix.partition(".")
    if not sep or not dot or not order.isdigit() or not layer:
        return None
    return int(order), layer, index


def open_zip(path: Path, unreadable: Callable[[Exception], LauncherError]) -> zipfile.ZipFile:
    """A model file that is a zip archive; NotFound when missing, unreadable(exc) when it is no zip."""
    try:
        return zipfile.ZipFile(path)
    except FileNotFoundError:
        raise NotFound(f"no model file {path}") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise unreadable(exc) from exc


def load_canonical(path: Path) -> Weights:
    """``canonical.npz``: entries ``NNN.<layer>/<i>.npy``; NNN gives the model order."""
    zf = open_zip(path, lambda exc: Corrupt(f"{path} is not a readable zip archive ({exc})",
                                            "re-pull the run (`launcher pull RUN`)"))
    entries: list[tuple[int, str, str, str]] = []
    with zf:
        for info in zf.infolist():
            parts = _split_canonical(info.filename)
            if parts is None:
                raise Corrupt(f"{path}: entry {info.filename!r} is not named NNN.<layer>/<i>.npy",
                              "re-pull the run, or re-save the model with the runtime's canonical writer")
            entries.append((*parts, info.filename))
        entries.sort(key=lambda e: (e[0], e[1], _index_key(e[2])))
        arrays = [WeightArray(layer, index, read_npy(zf.read(name), name, path))
                  for _, layer, index, name in entries]
    return Weights(path, arrays)


def _index_key(index: str) -> tuple[int, int | str]:
    return (0, int(index)) if index.isdigit() else (1, index)


def load_npy(path: Path) -> Weights:
    """One .npy array, or a plain .npz (np.savez): each entry one array."""
    if path.name.endswith(".npy"):
        try:
            with open(path, "rb") as f:
                return Weights(path, [WeightArray(path.stem, "0", read_npy(f.read(), path.name, path))])
        except FileNotFoundError:
            raise NotFound(f"no model file {path}") from None
    zf = open_zip(path, lambda exc: Corrupt(f"{path} is not a readable .npz archive ({exc})",
                                            "re-pull the run (`launcher pull RUN`)"))
    with zf:
        return Weights(path, [WeightArray(n.removesuffix(".npy"), "0", read_npy(zf.read(n), n, path))
                              for n in zf.namelist()])


def is_canonical_npz(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return bool(names) and all(_split_canonical(n) is not None for n in names)
