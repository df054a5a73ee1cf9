"""A run's folder on the user's machine, ``runs/<run-id>/``: the one owner of its layout.

- ``launch.json``: written when the run starts (launcher.runs.lifecycle), the run's launch record;
- ``outputs/``: what the container wrote, pulled back (``outputs/logs/train.log`` its console log);
- ``.pulled.json``: which outputs were pulled and verified already (launcher.transfers.pull);
- ``manifest.json``: written last, once the run ended and its outputs are here (launcher.records.manifest):
  a folder without it is a run still going, or one whose pull did not finish.

Every module reaches these files through a :class:`RunDir`; nobody else spells their names. The launch record
is read and written here alone (`read_launch`, `write_launch`), with its `record_version`: an older record is
brought up to date as it is read (`_migrated`), so every reader sees one shape. The manifest's reader and writer
is launcher.records.manifest.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from launcher.errors import Corrupt, NotFound, SchemaTooNew, UsageError
from launcher.hashing import atomic_write_json
from launcher.records.records import LaunchRecord

if TYPE_CHECKING:
    from launcher.workspace import Workspace

LAUNCH = "launch.json"
MANIFEST = "manifest.json"
PULLED = ".pulled.json"
OUTPUTS = "outputs"
TRAIN_LOG = "logs/train.log"  # inside outputs/
# what the runtime in the container records about the run, inside outputs/ (launcher.runtime)
EXIT_RECORD = "_launcher/exit.json"
CODE_RECORD = "_launcher/code.json"
RUNTIME_RECORD = "_launcher/runtime.json"
# 1: no record_version; the container kept as its rendered `docker run` line (argv). 2: as its ContainerSpec.
LAUNCH_VERSION = 2
_RUN_ID = re.compile(r"^[0-9]{8}T[0-9]{6}-[A-Za-z0-9_.-]+-[0-9a-f]{6}$")


def is_run_id(text: str) -> bool:
    """Whether text is a run id launcher makes (one folder name: no separator, nothing to escape with)."""
    return bool(_RUN_ID.match(text))


@dataclass(frozen=True)
class RunDir:
    path: Path

    @classmethod
    def of(cls, ws: Workspace, run_id: str) -> RunDir:
        """The folder of run_id in the workspace (a usage error for what is not a run id)."""
        if not _RUN_ID.match(run_id):
            raise UsageError(f"{run_id!r} is not a run id", "see `launcher ps` for run ids")
        return cls(ws.runs / run_id)

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def launch_file(self) -> Path:
        return self.path / LAUNCH

    @property
    def manifest_file(self) -> Path:
        return self.path / MANIFEST

    @property
    def pulled_file(self) -> Path:
        return self.path / PULLED

    def pulled_file_of(self, part: str) -> Path:
        """The pull state of outputs pulled from another place than the run's host (``part``: a folder under the
        outputs, such as nodes/1 of a node on its own host)."""
        return self.path / (PULLED.removesuffix(".json") + "-" + part.replace("/", "-") + ".json")

    @property
    def outputs(self) -> Path:
        return self.path / OUTPUTS

    @property
    def train_log(self) -> Path:
        return self.outputs / TRAIN_LOG

    def is_run(self) -> bool:
        """Whether the folder holds a run: one started here (launch.json) or brought here (manifest.json)."""
        return self.path.is_dir() and (self.launch_file.is_file() or self.manifest_file.is_file())

    def is_complete(self) -> bool:
        return self.path.is_dir() and self.manifest_file.is_file()

    def has_launch(self) -> bool:
        return self.launch_file.is_file()

    def read_launch(self) -> LaunchRecord:
        """The launch record, brought up to this launcher's version; NotFound or Corrupt when it cannot be read."""
        try:
            data = json.loads(self.launch_file.read_text())
        except FileNotFoundError:
            raise NotFound(f"no run {self.run_id} in {self.path.parent}", "see `launcher ps` for run ids") from None
        except (OSError, ValueError) as exc:
            raise Corrupt(f"{self.launch_file} is unreadable: {exc}",
                          "the run cannot be read; start it again with `launcher run`") from exc
        if not isinstance(data, dict) or not isinstance(data.get("run_id"), str):
            raise Corrupt(f"{self.launch_file} is not a launch record",
                          "the run cannot be read; start it again with `launcher run`")
        return _migrated(data, self.launch_file)

    def read_launch_quiet(self) -> LaunchRecord | None:
        """The launch record, or None where there is none or it is unreadable (listings skip such runs)."""
        try:
            launch = self.read_launch()
        except (NotFound, Corrupt, SchemaTooNew):
            return None
        return launch if isinstance(launch.get("group"), str) else None  # what listings read

    def write_launch(self, launch: LaunchRecord) -> None:
        """The launch record written whole (or not at all), as this launcher's version."""
        atomic_write_json(self.launch_file, {**launch, "record_version": LAUNCH_VERSION})

    def forget_pulled(self) -> None:
        """Back to a started run: the manifest, the pull state and the outputs pulled so far removed
        (a resumed run rewrites its outputs). The manifest goes first: no half-state looks complete."""
        import shutil

        self.manifest_file.unlink(missing_ok=True)
        self.pulled_file.unlink(missing_ok=True)
        for other in self.path.glob(PULLED.removesuffix(".json") + "-*.json"):
            other.unlink(missing_ok=True)
        shutil.rmtree(self.outputs, ignore_errors=True)



def _migrated(data: dict[str, object], source: Path) -> LaunchRecord:
    """A launch record as this launcher writes it, from any version an earlier one wrote."""
    version = data.get("record_version", 1)
    if not isinstance(version, int) or isinstance(version, bool):
        raise Corrupt(f"{source} has a record_version that is not a number", "start the run again with `launcher run`")
    if version > LAUNCH_VERSION:
        raise SchemaTooNew(f"{source} is a launch record of version {version}; this launcher reads up to "
                           f"{LAUNCH_VERSION}", "upgrade launcher to read it")
    record = dict(data)
    argv = record.get("argv")
    if version < 2 and "container_spec" not in record and isinstance(argv, list):
        from launcher.hosts import engine

        try:  # the command line an older launcher rendered, read back as the spec it came from
            record["container_spec"] = engine.spec_from_argv([str(a) for a in argv]).to_record()
            del record["argv"]
        except ValueError:
            pass  # kept as it was: a reader that needs the container says it lacks it
    record["record_version"] = LAUNCH_VERSION
    return cast(LaunchRecord, record)
