"""The options only `launcher run` takes, as annotated types for its signature."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from launcher.cli.params import complete_recipe

RecipeArg = Annotated[
    str,
    typer.Argument(
        metavar="RECIPE",
        autocompletion=complete_recipe,
        help="A recipe name (recipes/NAME), a recipe folder, a .py script (sent with its project folder), "
        "or a folder with --entry.",
    ),
]
DataFromOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-from",
        metavar="DIR",
        help="Dataset folder on this machine: sent to the host by content (a later run with the same "
        "files sends nothing), then mounted read-only like --data.",
    ),
]
ReplicatesOpt = Annotated[int, typer.Option("--runs", "-n", metavar="N",
                                            help="Replicates per seed, grouped for verify. The first that fails stops "
                                            "the rest.")]
DetachOpt = Annotated[bool, typer.Option("--detach", "-d", help="Start and return; `launcher pull` later.")]
GroupOpt = Annotated[str | None, typer.Option("--group", "-g", metavar="NAME", help="Group name (default: generated).")]
ShipViaOpt = Annotated[
    str | None,
    typer.Option(
        "--ship-via",
        metavar="REGISTRY",
        help="Ship the image through this local registry (e.g. 127.0.0.1:5000) and a reverse SSH tunnel "
        "instead of docker save/load: a rebuild then sends only its new layers. On a Slurm cluster: a registry "
        "its nodes pull from, or `shared` for an archive on its shared filesystem (default: the registry set "
        "by `provision --scheduler slurm --registry`, else `shared`).",
    ),
]
NoBuildOpt = Annotated[
    bool,
    typer.Option(
        "--no-build",
        help="Refuse (exit 25) instead of rebuilding when the workspace's recipes, runtime, lock or "
        "Dockerfile differ from the image. By default run rebuilds first (a recipe edit takes seconds).",
    ),
]
MountOpt = Annotated[
    bool,
    typer.Option(
        "--mount",
        help="Development mode: mount the workspace recipe read-only instead of running the copy baked into "
        "the image, so an edit needs no rebuild (recorded as mounted, with the digest of what was mounted).",
    ),
]
CodeDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--code",
        metavar="DIR",
        help="For a plain script: the folder sent with it (default: the enclosing git work tree, else the "
        "script's folder; .gitignore respected).",
    ),
]
EntryOpt = Annotated[
    str | None,
    typer.Option("--entry", metavar="FILE", help="Run FILE inside the folder RECIPE, which has no recipe.toml."),
]
NodesOpt = Annotated[
    int | None,
    typer.Option(
        "--nodes",
        metavar="N",
        help="Run on N nodes, one container each, all from the same image ID, ranks laid out node by node (PyTorch: "
        "torchrun, static rendezvous; TensorFlow: a TF_CONFIG per worker; JAX: jax.distributed with node 0 as "
        "coordinator). On the local engine or one host: N "
        "containers on a private network; with --host given N times: one node on each host, on its host's network "
        "(default N: the number of --host). "
        "Recorded as the run's topology; a different world size is an environment difference in verify.",
    ),
]
ExperimentNodesOpt = Annotated[
    int | None,
    typer.Option(
        "--nodes",
        metavar="N",
        help="Each run on N nodes (as `launcher run --nodes`): N containers on the engine of the host that runs it, "
        "or one Slurm job of N nodes with --scheduler slurm. Repeated --host spreads the runs over hosts here.",
    ),
]
ProcsPerNodeOpt = Annotated[
    int | None,
    typer.Option(
        "--procs-per-node",
        metavar="M",
        help="Processes (ranks) per node (default 1): world size N x M; rank 0 writes the run's outputs, rank r its "
        "records under outputs/ranks/r, whichever node ran it; node k's own under outputs/nodes/k.",
    ),
]
ReductionOpt = Annotated[
    str,
    typer.Option(
        "--reduction",
        metavar="default|canonical",
        help="How a PyTorch data-parallel step's gradients are summed when the script steps through "
        "launcher.runtime.api.micro_batches: default (DDP's own all-reduce) or canonical (a fixed binary tree over "
        "the micro-batches, gathered, not all-reduced: the same bits for any world size or layout with the same "
        "global batch; docs/distributed.md says what it cannot cover).",
    ),
]
