"""A run planned once: :func:`plan_run` resolves a :class:`~launcher.specs.request.RunRequest` on its
placement into a frozen :class:`ResolvedRun`: the recipe and its params checked, the probes record, the
image made current (the variant's, or with the project layer: :mod:`launcher.runs.project`), the code
planned (``specs.runspec.plan_code``) and placed on the target, the data sent there, the host's facts,
the group and its replicates. :mod:`launcher.runs.lifecycle` builds each replicate's container and launch
record from the ResolvedRun alone; nothing is filled in afterwards.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from launcher.errors import UsageError
from launcher.proc import Meanwhile
from launcher.progress import Reporter
from launcher.records.records import BAKED, MOUNTED, CodePlan, DataSource, ImageRecord, ProbesRecord
from launcher.specs.recipes import ParamValue, Recipe
from launcher.specs.request import RunRequest
from launcher.specs.runspec import check_framework, check_params, image_record, load_recipe, plan_code, probes_record
from launcher.specs.topology import Topology
from launcher.targets.placement import Placement
from launcher.workspace import Workspace

if TYPE_CHECKING:
    from launcher.hosts.provision import HostFacts, NoFacts


@dataclass(frozen=True)
class Replicate:
    number: int  # its number in the group (numbered across seeds)
    seed: int | None  # None: the profile's default


@dataclass(frozen=True)
class ResolvedRun:
    """A request resolved on its placement: everything a replicate's container and launch record need."""

    request: RunRequest
    recipe: Recipe
    params: dict[str, ParamValue]  # the recipe's, checked
    probes: ProbesRecord
    image: ImageRecord  # the image the runs use (the variant's, or with the project layer), less its "recipes"
    baked_digest: str | None  # the digest the image records for the recipe baked into it
    code: CodePlan  # what code runs, and where the target has it when it is mounted
    code_identity: str | None  # a plain script's project/path (specs.identity); None for a recipe
    data: str | None  # the folder on the target mounted as the data
    data_source: DataSource | None  # where that folder came from
    group: str
    facts: HostFacts | NoFacts  # the host's fact sheet, {} when none was read
    replicates: tuple[Replicate, ...]
    topology: Topology | None = None  # the request's, with the recipe's framework's way of starting ranks


def plan_run(ws: Workspace, request: RunRequest, placement: Placement, reporter: Reporter | None = None, *,
             runs: int = 1, seeds: Sequence[int | None] = (), facts: HostFacts | None = None,
             prepared: bool = False, recorded: bool = False) -> ResolvedRun:
    """The request resolved: `runs` replicates of each seed (none given: the request's seed), numbered from
    request.replicate. facts: the host's fact sheet, when read already; prepared: the target prepared
    already (by an earlier part of the group). recorded: the request's image and code plan are a run's, as
    recorded (a diverge re-execution): nothing is locked, built or checked against the framework again, and
    the facts are those given ({} when none)."""
    from launcher.specs import identity

    seed_list = list(seeds) or [request.seed]
    recipe, params = _checked(ws, request, seed_list, framework=not recorded)
    topology = placement.topology_for(request.topology)  # before anything is built or sent: one it cannot place
    plan: CodePlan | None = None
    sheet: HostFacts | NoFacts
    if recorded:
        image = request.image if request.image is not None else image_record(ws, request.variant)
        sheet = facts if facts is not None else {}
        if not prepared:
            placement.prepare(ws.needs_gpu(request.variant))
    else:
        image, plan, sheet = _image_facts_ready(ws, request, recipe, placement, reporter, facts, prepared)
    data, source = _data(request, placement, reporter)
    if plan is None:
        plan = request.code_plan if request.code_plan is not None else plan_code(ws, request, recipe)
    plan = _placed_code(plan, placement, reporter)
    image = image.copy()
    baked_digests = image.pop("recipes", {})
    code_identity = identity.from_plan(plan) if recipe.adhoc else None
    replicates = tuple(Replicate(request.replicate + i, seed)  # numbered across seeds
                       for i, seed in enumerate(s for s in seed_list for _ in range(runs)))
    return ResolvedRun(request=request, recipe=recipe, params=params,
                       probes=probes_record(request, recipe), image=image,
                       baked_digest=baked_digests.get(recipe.name), code=plan, code_identity=code_identity,
                       data=data, data_source=source, group=_group_of(request, recipe, code_identity),
                       facts=sheet, replicates=replicates,
                       topology=topology.for_framework(recipe.framework) if topology else None)


def _checked(ws: Workspace, request: RunRequest, seed_list: Sequence[int | None], *,
             framework: bool) -> tuple[Recipe, dict[str, ParamValue]]:
    """The request's recipe and its params checked against it: a bad param, framework (unless recorded),
    profile, seed or thread count stops here, before a build or an upload (the options were parsed with
    the request)."""
    from launcher import determinism

    recipe = load_recipe(ws, request.recipe, entry=request.entry)
    params = check_params(recipe, request.params)
    if framework:
        check_framework(ws, recipe, request.variant)
    from launcher.specs import topology

    topology.check_framework(request.topology, recipe.framework, request.recipe, request.checkpoints is not None)
    for seed in seed_list:
        determinism.profile_env(request.profile, seed, request.threads)
    return recipe, params


def _image_and_code(ws: Workspace, request: RunRequest, recipe: Recipe,
                    reporter: Reporter | None) -> tuple[ImageRecord, CodePlan]:
    """The image made current (the variant's, plus the project layer) and the code planned."""
    from launcher.images import build
    from launcher.runs import project

    with Meanwhile(build.ask_ahead, ws, request.variant):  # the engine asked about the image while git lists code
        project.ensure_lock(ws, request, recipe, reporter)  # before the code is planned: the lock is part of it
        # a plan given (launcher reproduce plans a bundle's code itself, without git) is kept
        plan = request.code_plan if request.code_plan is not None else plan_code(ws, request, recipe)
    build.ensure_current(ws, request.variant, recipes=plan.get("source") == BAKED, allow_build=request.build,
                         find_links=[Path(p) for p in request.find_links],
                         ca_bundle=Path(request.ca_bundle) if request.ca_bundle else None, reporter=reporter)
    image = project.image_for(ws, request, recipe, reporter)  # the variant's image plus the project layer, if any
    return (image if image is not None else image_record(ws, request.variant)), plan


def _facts_for_run(ws: Workspace, placement: Placement) -> HostFacts:
    from launcher.hosts import provision

    return provision.facts_for_run(ws, placement.host)


def _image_facts_ready(ws: Workspace, request: RunRequest, recipe: Recipe, placement: Placement,
                       reporter: Reporter | None, facts: HostFacts | None,
                       prepared: bool) -> tuple[ImageRecord, CodePlan, HostFacts]:
    """The image current and the code planned, the host's fact sheet, and the target prepared (once for the
    group; prepared: by an earlier part of it), before data and code are sent. The three are independent, so
    the facts and the target's checks run while the image is checked (or built); their errors come in that
    order, as when each waited for the one before."""
    later = Meanwhile(_facts_for_run, ws, placement) if facts is None else None
    ready = None if prepared else Meanwhile(placement.prepare, ws.needs_gpu(request.variant))
    with later or nullcontext(), ready or nullcontext():
        image, plan = _image_and_code(ws, request, recipe, reporter)
        facts = later.result() if later is not None else facts
        if ready is not None:
            ready.result()
    assert facts is not None
    return image, plan, facts


def _data(request: RunRequest, placement: Placement,
          reporter: Reporter | None) -> tuple[str | None, DataSource | None]:
    """The folder the runs mount as their data, and where it came from: --data-from's folder sent to the
    target and mounted from there, else --data's folder on the host."""
    path, source = request.data, None
    if request.data_from:
        if request.data:
            raise UsageError(
                "--data and --data-from both given", "--data names a folder on the host, --data-from one here: pick one"
            )
        path, source = placement.send_data(Path(request.data_from).expanduser(), reporter)
    data = str(PurePosixPath(path)) if path else None
    return data, source or ({"kind": "host", "path": data} if data else None)


def _placed_code(plan: CodePlan, placement: Placement, reporter: Reporter | None) -> CodePlan:
    """Mounted code placed where the target mounts it from; baked code needs nothing."""
    if plan.get("source") != MOUNTED or plan.get("host_path"):
        return plan
    return placement.send_code(plan, reporter)


def _group_of(request: RunRequest, recipe: Recipe, code_identity: str | None) -> str:
    """The group the runs join: the request's, else a new one named by time, code and a random suffix."""
    from launcher.specs import identity

    name = identity.slug(recipe.name, code_identity)
    return request.group or f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{name}-g{secrets.token_hex(3)}"
