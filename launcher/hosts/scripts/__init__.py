"""Scripts that run on a host, kept as files of the package and sent as text.

The rule: each file here runs on a host that has nothing of launcher installed, so a ``.py``
file uses only the standard library of the host's ``python3`` and a ``.sh`` file only POSIX
``sh`` and the usual tools. Launcher reads a file's text (:func:`text`) and sends it as an
argument (``python3 -c TEXT ARGS...`` or ``sh -c TEXT sh ARGS...``), or writes it as a file
where a scheduler runs it later (the Slurm task). A script gets its values as arguments, from the
environment or from a file of values beside it, never by formatting its text.

The ``.py`` files are also modules of the package, so ruff and mypy check them and tests can
import them: each guards its entry with ``if __name__ == "__main__":`` (true under ``-c``).
Annotations that name builtin generics are quoted, so that an older ``python3`` on a host
never evaluates them.

- ``listdir.py``: every entry under a directory (lstat), regular files hashed (``Host.list_dir``).
- ``datalist.py``: size, age and name of each dataset folder on a host (``datasets.prune_host``).
- ``facts.sh``: the host's read-only fact sheet (``provision.gather_facts``).
- ``write_atomic.sh``: a file written from stdin whole or not at all (``Host.write_atomic``).
- ``pull_files.py``: streams a run's output files, hashed as sent (``launcher.transfers.pull``).
- ``dockerd.sh``: stop, start or await dockerd on a host without systemd (``provision.start_docker``).
- ``node_probe.sh``: a Slurm node's Docker, runtimes, enroot and registry reach (``targets.cluster``).
- ``stage_load.sh``: ``docker load`` of a staged image's layers (``Engine.load_staged``).
- ``slurm_task.sh``: one replicate of a run on a Slurm node (bash), its values in ``task.args``
  (``launcher.targets.slurm``).
- ``slurm_nodes.sh``: a run of several nodes as one Slurm job of N nodes (bash), written as ``nodes.sh``: one
  ``task.sh`` per node through srun, the first node to fail stopping the others (``launcher.targets.slurm``).
- ``slurm_array.sh``: a Slurm job array (bash), written as ``array.sh`` and given to sbatch with
  its options on the command line; task i runs the i-th task script listed in ``tasks``
  (``launcher.targets.slurm``).
- ``ray_job.py``: the exception to the rule above: it runs on a Ray cluster's head under the Python that has Ray
  (imported inside its functions only): the job API's calls (submit, status, list, stop), and, written as
  ``driver.py`` into a group's folder, the Ray job that runs its replicates as tasks on the nodes
  (``launcher.targets.ray``).
"""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def text(name: str) -> str:
    """The text of the host script ``name`` (a file name in this folder, e.g. ``"listdir.py"``)."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
