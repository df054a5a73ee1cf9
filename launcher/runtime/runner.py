"""`python -m launcher.runtime run`: the container's command (see docs/design.md); and
`python -m launcher.runtime explain`, the Grad-CAM of a saved model for one image (launcher.runtime.explain).

Reads the recipe, checks the data against what the recipe expects, starts the recipe in a
child interpreter with the hooks applied, tees its output to ``logs/train.log`` and writes
``_launcher/exit.json``. The exit status is the recipe's.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import launcher
from launcher.runtime import checkpoint, distributed, probespec, recipeparams, workdir
from launcher.runtime import code as codemod
from launcher.runtime import explain as explainmod
from launcher.runtime import fingerprints as fp
from launcher.runtime import recipespec as recipe_spec
from launcher.runtime.outfiles import DATASET_JSON, EXIT_JSON, METRICS, RANKS_JSON, RUNTIME_JSON
from launcher.runtime.record import EXIT_BAD_DATA, EXIT_BAD_RECIPE, EXIT_NOT_RESUMABLE, EXIT_USAGE, expected_mismatch

if TYPE_CHECKING:
    from launcher.runtime.records import JsonValue

PREVIOUS_RUN = ("_launcher", "fingerprints", METRICS, "model", "weights")
LAUNCHER_ROOT = Path(launcher.__file__).resolve().parent.parent
LIB_DIR = "_lib"  # the shared recipe library: a folder beside the recipes, not a recipe
IMAGE_LIB = Path("/opt/launcher/recipes") / LIB_DIR  # the one baked into an image


class RunError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def terminal_columns() -> int:
    """shutil.get_terminal_size().columns: $COLUMNS when a positive integer, else the width of the
    terminal on stdout, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class _Formatter(argparse.HelpFormatter):
    """argparse's help formatter, its width found as argparse finds it but without importing shutil
    (and bz2 and lzma with it), which argparse does for every argument added, before every run."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, terminal_columns() - 2 if width is None else width)


class _Parser(argparse.ArgumentParser):
    """argparse's parser with :class:`_Formatter`; its subcommands' parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m launcher.runtime",
        description="Run a recipe with determinism applied and fingerprints recorded, or explain a saved "
        "model's prediction for one image.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a recipe folder or a plain script")
    what = run.add_mutually_exclusive_group(required=True)
    what.add_argument("--recipe", type=Path, help="a recipe folder (holds recipe.toml)")
    what.add_argument("--script", type=Path, help="a plain Python script")
    run.add_argument("--out", type=Path, required=True, help="the outputs folder")
    run.add_argument("--data", type=Path, help="the dataset folder (read only)")
    run.add_argument("--params", default="{}", help="params as a JSON object")
    run.add_argument("--profile", help="apply this determinism profile here (host runs; a container gets "
                     "the environment from `docker run -e`)")
    run.add_argument("--seed", type=int, help="the seed for --profile")
    run.add_argument("--threads", type=int, help="the thread count for --profile")
    run.add_argument("--code-root", type=Path, help="the folder of code the script belongs to (its digest is "
                     "recorded; default: the recipe folder, or the script alone)")
    run.add_argument("--code-source", default="host", choices=("image", "mounted", "host"),
                     help="where the code comes from: baked into the image, mounted into the container, or "
                     "this machine (recorded in _launcher/code.json)")
    run.add_argument("--lib", type=Path, help="the shared recipe library put on the recipe's path (default: "
                     f"{LIB_DIR}/ beside the recipe folder, else the image's {IMAGE_LIB}; recorded in "
                     "_launcher/code.json)")
    probes = run.add_mutually_exclusive_group()
    probes.add_argument("--probes", metavar="JSON", help="the probe set to record (a [probes] table as a JSON "
                        "object), instead of recipe.toml's")
    probes.add_argument("--no-probes", action="store_true", help="record no probes, whatever recipe.toml says")
    run.add_argument("--nodes", type=int, default=1, help="the run's nodes (one container each)")
    run.add_argument("--procs-per-node", type=int, default=1, help="processes (ranks) on each node")
    run.add_argument("--node-rank", type=int, default=0, help="this node's rank, 0 to --nodes - 1")
    run.add_argument("--master", default="localhost", metavar="ADDR[:PORT]",
                     help=f"rank 0's node address for the rendezvous (default port {distributed.MASTER_PORT})")
    run.add_argument("--peers", metavar="ADDR,...", help="every node's address, node 0's first (TensorFlow's "
                     "workers; default: --master's for one node)")
    run.add_argument("--launcher", default="torchrun", choices=sorted(set(distributed.LAUNCHERS.values())),
                     help="how this node's ranks are started: torchrun (PyTorch), tf_config (TensorFlow workers)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    explainmod.add_parser(sub)
    return parser


class Tee:
    TAIL = 16384  # the last bytes written, kept to explain a failure

    def __init__(self, log: IO[bytes]) -> None:
        self.log = log
        self.tail = b""

    def write(self, data: bytes) -> None:
        self.tail = (self.tail + data)[-self.TAIL:]
        self.log.write(data)
        self.log.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    def say(self, line: str) -> None:
        self.write(f"launcher: {line}\n".encode())


def host_profile_env(profile: str, seed: int | None, threads: int | None) -> dict[str, str]:
    """The profile's variables, for a run started on the host (a container gets them from its environment)."""
    from launcher.runtime.profiles import ProfileError, profile_env

    try:
        return profile_env(profile, seed, threads)
    except ProfileError as exc:
        raise RunError(f"{exc.problem}; fix: {exc.fix}", EXIT_USAGE) from None


def prepare(args: argparse.Namespace, tee: Tee) -> tuple[recipe_spec.RecipeSpec, dict[str, str]]:
    """The recipe to run and the environment for its interpreter; raises RunError."""
    given = _given_params(args)
    probes_given = given_probes(args)
    spec = _load_recipe(args)
    params = _merged_params(spec, given)
    lib = recipe_lib(spec, args.lib)
    record_code(spec, args, tee, lib)
    dataset = recipeparams.select_dataset(spec, params)
    env = dict(os.environ)
    if args.profile is not None:
        env.update(host_profile_env(args.profile, args.seed, args.threads))
    _data_env(args, dataset, env, tee)
    _probes_env(args, spec, probes_given, env, tee)
    env.update({
        "LAUNCHER_OUT": str(args.out.resolve()),
        "LAUNCHER_PARAMS": recipeparams.params_json(params),
        "LAUNCHER_RECIPE": spec.name,
        "LAUNCHER_FRAMEWORK": spec.framework,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(LAUNCHER_ROOT), str(lib or ""), env.get("PYTHONPATH", ""))
                                      if p),
    })
    _announce(args, spec, params, env, tee)
    return spec, env


def _given_params(args: argparse.Namespace) -> dict[str, JsonValue]:
    """--params as a JSON object; raises RunError."""
    try:
        given = json.loads(args.params)
    except json.JSONDecodeError as exc:
        raise RunError(f"--params is not JSON: {exc}", EXIT_USAGE) from None
    if not isinstance(given, dict):
        raise RunError("--params must be a JSON object", EXIT_USAGE)
    return given


def _load_recipe(args: argparse.Namespace) -> recipe_spec.RecipeSpec:
    """The recipe folder's spec, or a plain script's ad-hoc one; raises RunError."""
    try:
        if args.recipe is not None:
            return recipe_spec.load_spec(args.recipe.resolve())
        script = args.script.resolve()
        if not script.is_file():
            raise RunError(f"no script at {script}", EXIT_USAGE)
        return recipe_spec.adhoc_spec(script, framework="auto")
    except recipe_spec.SpecError as exc:
        raise RunError(str(exc), EXIT_BAD_RECIPE) from None


def _merged_params(spec: recipe_spec.RecipeSpec, given: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """The recipe's defaults overridden by --params, each checked; raises RunError."""
    try:
        return recipeparams.merge_params(spec, given)
    except recipe_spec.SpecError as exc:
        raise RunError(str(exc), EXIT_USAGE) from None
    except recipe_spec.ParamError as exc:
        raise RunError(f"{exc}; fix: give {exc.param.name} one of the allowed values in --params", EXIT_USAGE) from None


def _data_env(args: argparse.Namespace, dataset: recipe_spec.DatasetSpec | None, env: dict[str, str],
              tee: Tee) -> None:
    """--data fingerprinted and checked against the selected dataset; LAUNCHER_DATA and
    LAUNCHER_DATASET set in env. Raises RunError."""
    if args.data is not None:
        data = args.data.resolve()
        if not data.is_dir():
            raise RunError(f"--data {data} is not a folder", EXIT_BAD_DATA)
        if dataset is not None and dataset.source == "builtin":
            raise RunError(f"--data was given but {dataset.param}={dataset.name} selects built-in data; "
                           f"choose a files dataset with --param {dataset.param}=...", EXIT_USAGE)
        doc = fp.files_fingerprint(data)
        fp.write_json(args.out / DATASET_JSON, doc)
        tee.say(f"dataset {data}: {len(doc['entries'])} files, {doc['digest']}")
        if dataset is not None:
            problem = expected_mismatch(dataset.as_dict(), doc, str(data))
            if problem:
                raise RunError(problem, EXIT_BAD_DATA)
        env["LAUNCHER_DATA"] = str(data)
    elif dataset is not None and dataset.source == "files":
        raise RunError(f"{dataset.param}={dataset.name} reads files ({dataset.format or 'see recipe.toml'}) "
                       "but no --data folder was given", EXIT_BAD_DATA)
    if dataset is not None:
        env["LAUNCHER_DATASET"] = json.dumps(dataset.as_dict(), sort_keys=True)


def _probes_env(args: argparse.Namespace, spec: recipe_spec.RecipeSpec, probes_given: probespec.ProbeSpec | None,
                env: dict[str, str], tee: Tee) -> None:
    """LAUNCHER_PROBES: --probes, else the recipe's [probes] (none with --no-probes)."""
    probes = probes_given if (probes_given is not None or args.no_probes) else spec.probes
    if probes is not None:
        env["LAUNCHER_PROBES"] = json.dumps(probes.as_dict(), sort_keys=True)
    elif args.no_probes or not spec.adhoc:
        env.pop("LAUNCHER_PROBES", None)
    if args.no_probes or probes_given is not None:
        tee.say("probes: off (--no-probes)" if probes is None else
                f"probes: {json.dumps(probes.as_dict(), sort_keys=True)} (--probes)")


def _announce(args: argparse.Namespace, spec: recipe_spec.RecipeSpec, params: dict[str, JsonValue],
              env: dict[str, str], tee: Tee) -> None:
    """What runs, with which params, arguments and profile, for the log."""
    tee.say(f"script {spec.entry}: the profile reaches TensorFlow/Keras, PyTorch or JAX when its code imports them"
            if spec.adhoc else
            f"recipe {spec.name} ({spec.framework}), params {recipeparams.params_json(params)}")
    script_args = args.args[1:] if args.args[:1] == ["--"] else list(args.args)
    if script_args:
        tee.say("script arguments: " + " ".join(script_args))
    tee.say(f"profile {env.get('LAUNCHER_PROFILE', 'off')}, seed {env.get('LAUNCHER_SEED', '-')}, "
            f"threads {env.get('LAUNCHER_THREADS', '-')}")


def given_probes(args: argparse.Namespace) -> probespec.ProbeSpec | None:
    """--probes JSON checked as recipe.toml's [probes] is (None without it); raises RunError."""
    if args.probes is None:
        return None
    try:
        return probespec.from_json(json.loads(args.probes))
    except json.JSONDecodeError as exc:
        raise RunError(f"--probes is not JSON: {exc}", EXIT_USAGE) from None
    except probespec.ProbeError as exc:
        raise RunError(f"--probes: {exc}", EXIT_USAGE) from None


def recipe_lib(spec: recipe_spec.RecipeSpec, given: Path | None) -> Path | None:
    """The shared recipe library a recipe folder runs with: --lib, else the _lib folder beside
    the recipe (a workspace's recipes/, or the image's baked ones), else the image's baked _lib
    (a mounted recipe folder). A plain script gets none: it is its own code."""
    if given is not None:
        if not given.is_dir():
            raise RunError(f"--lib {given} is not a folder", EXIT_USAGE)
        return given.resolve()
    if spec.adhoc:
        return None
    for lib in (spec.path.parent / LIB_DIR, IMAGE_LIB):
        if lib.is_dir():
            return lib.resolve()
    return None


def record_code(spec: recipe_spec.RecipeSpec, args: argparse.Namespace, tee: Tee, lib: Path | None = None) -> None:
    """Write _launcher/code.json: digests of the code about to run, read from the files here
    (inside the container, from what it executes), never from what the host believes it sent.
    The shared recipe library on the recipe's path is code that runs too: its digest is beside
    the recipe's."""
    root: Path = args.code_root.resolve() if args.code_root is not None else spec.path
    code = codemod.describe(root)
    lock = LAUNCHER_ROOT / "lock.txt"
    doc = {
        "recipe": {**code, "path": str(root), "source": args.code_source,
                   "entry": str(spec.entry_path.relative_to(root)) if root.is_dir() else spec.entry_path.name},
        "runtime": {"digest": codemod.runtime_digest(LAUNCHER_ROOT / "launcher")},
        "lock_sha256": fp.sha256_file(lock) if lock.is_file() else None,
        "packages": installed_packages(),
    }
    lib_code = codemod.describe(lib) if lib is not None else None
    if lib_code is not None:
        doc["lib"] = {**lib_code, "path": str(lib)}
    fp.write_json(args.out / "_launcher/code.json", doc)
    tee.say(f"code {root} ({code['files']} files, {args.code_source}): {code['digest']}")
    if lib_code is not None:
        tee.say(f"recipe library {lib} ({lib_code['files']} files): {lib_code['digest']}")


def installed_packages() -> dict[str, object]:
    """The distributions importable here, as name==version, and their digest."""
    names = sorted(distributions())
    return {"count": len(names), "digest": fp.digest_of(names)}


def distributions(path: list[str] | None = None) -> set[str]:
    """name==version of each distribution on path (sys.path), the name in lower case: what
    importlib.metadata.distributions() finds there (tests compare the two), read from the Name and
    Version headers of each *.dist-info/METADATA and *.egg-info (PKG-INFO) without importlib.metadata
    and the email parser it brings, whose import would be paid before every run's first line."""
    found: set[str] = set()
    for entry in sys.path if path is None else path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip file, a missing folder
            continue
        for name in names:
            low = name.lower()
            if low.endswith(".dist-info"):
                meta = os.path.join(entry, name, "METADATA")
            elif low.endswith(".egg-info"):
                full = os.path.join(entry, name)
                meta = os.path.join(full, "PKG-INFO") if os.path.isdir(full) else full
            else:
                continue
            found.add(_name_version(meta))
    return found


def _name_version(meta: str) -> str:
    """"name==version" from a metadata file's headers ("?" for a name it lacks, "None" for a version)."""
    fields: dict[str, str] = {}
    try:
        with open(meta, encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                if not line.strip():
                    break  # the headers end at the first empty line
                key, sep, value = line.partition(":")
                if sep and not line[0].isspace() and key.lower() in ("name", "version") and key.lower() not in fields:
                    fields[key.lower()] = value.strip()
    except OSError:
        pass
    return f"{(fields.get('name') or '?').lower()}=={fields.get('version')}"


def layout_of(args: argparse.Namespace) -> distributed.Layout | None:
    """The node's place in a run of several processes (--nodes, --procs-per-node), else None; raises RunError."""
    if args.nodes == 1 and args.procs_per_node == 1:
        return None
    if args.nodes < 1 or args.procs_per_node < 1 or not 0 <= args.node_rank < args.nodes:
        raise RunError(f"--nodes {args.nodes} --procs-per-node {args.procs_per_node} --node-rank {args.node_rank}: "
                       "each at least 1 and the node rank below the node count", EXIT_USAGE)
    try:
        addr, port = distributed.parse_master(args.master)
    except ValueError as exc:
        raise RunError(str(exc), EXIT_USAGE) from None
    return distributed.Layout(args.nodes, args.procs_per_node, args.node_rank, addr, port)


def run_child(spec: recipe_spec.RecipeSpec, env: dict[str, str], args: argparse.Namespace, tee: Tee) -> int:
    extra = list(args.args)
    if extra[:1] == ["--"]:  # the separator itself; a "--" further on is the script's own
        extra = extra[1:]
    layout = layout_of(args)
    if layout is not None:  # this node's ranks, started by the framework's launcher (launcher.runtime.distributed)
        return distributed.run_node(layout, args.launcher, _peers(args, layout), str(spec.entry_path), extra, env,
                                    args.out, tee)
    cmd = [sys.executable, "-m", "launcher.runtime.child", str(spec.entry_path), *extra]
    proc = subprocess.Popen(cmd, env=env, cwd=str(args.out.resolve()), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)

    def forward(signum: int, _frame: Any) -> None:
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        stream = proc.stdout
        assert isinstance(stream, io.BufferedReader)
        # read1: whatever is there, so progress lines without a newline still show as they come
        for chunk in iter(lambda: stream.read1(1 << 16), b""):
            tee.write(chunk)
        rc = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - rc if rc < 0 else rc


def _peers(args: argparse.Namespace, layout: distributed.Layout) -> list[str]:
    """Every node's address, node 0's first (--peers; one node: rank 0's); raises RunError."""
    peers = [p for p in (args.peers or "").split(",") if p] or [layout.master_addr]
    if len(peers) != layout.nodes:
        raise RunError(f"--peers names {len(peers)} nodes, not --nodes {layout.nodes}", EXIT_USAGE)
    return peers


def run_prepared(args: argparse.Namespace, tee: Tee) -> int:
    """The recipe or script prepared and run; a plain script sees its folder and its data in its working
    directory while it runs (launcher.runtime.workdir). Raises RunError."""
    spec, env = prepare(args, tee)
    if not spec.adhoc:
        return run_child(spec, env, args, tee)
    view = workdir.show(args.out.resolve(), spec.entry_path.parent,
                        args.data.resolve() if args.data is not None else None)
    try:
        said = workdir.notice(view, spec.entry_path.name)
        if said:
            tee.say(said)
        rc = run_child(spec, env, args, tee)
    finally:
        workdir.hide(view)
    hint = workdir.hint_after_failure(tee.tail.decode("utf-8", "replace"), view) if rc != 0 else None
    if hint:
        tee.say(hint)
    return rc


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    # who gets the outputs at the end: launcher's, not the training's (a node's user must not reach its outputs)
    owner = os.environ.pop("LAUNCHER_OWNER", "")
    started = _now()
    resume = os.environ.get(checkpoint.ENV_RESUME) == "1"
    resumed_from = None
    if resume:
        try:
            resumed_from = prepare_resume(args)
        except checkpoint.NotResumable as exc:
            print(f"launcher: error: cannot resume: {exc}", file=sys.stderr)
            return EXIT_NOT_RESUMABLE
    else:
        previous = [rel for rel in PREVIOUS_RUN if (out / rel).exists()]
        if previous:
            print(f"launcher: error: {out} holds a previous run's outputs ({previous[0]}); give an empty --out",
                  file=sys.stderr)
            return EXIT_USAGE
    for sub in ("logs", "_launcher", "fingerprints"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    rc = 1
    with open(out / "logs/train.log", "ab" if resume else "wb") as log:
        tee = Tee(log)
        if resumed_from is not None:
            folder, state = resumed_from
            epochs, steps = state["next_epoch"], state["step"]
            tee.say(f"resuming from checkpoint {folder.name}: {epochs} epoch{'s' if epochs != 1 else ''} and "
                    f"{steps} step{'s' if steps != 1 else ''} done")
        try:
            rc = run_prepared(args, tee)
        except RunError as exc:
            tee.say(f"error: {exc}")
            rc = exc.code
        finally:
            if not (out / RUNTIME_JSON).exists() and args.node_rank == 0:
                import platform  # only here: a child that started wrote runtime.json itself

                fp.write_json(out / RUNTIME_JSON, {
                    "profile": os.environ.get("LAUNCHER_PROFILE", "off"), "framework": None,
                    "python": {"version": platform.python_version()},
                    "note": "the recipe's interpreter did not start"})
            fp.write_json(out / EXIT_JSON,
                          {"exit_code": rc, "started_at": started, "ended_at": _now()})
        tee.say(f"exit code {rc}")
    hand_over(out, owner)
    return rc


def prepare_resume(args: argparse.Namespace) -> checkpoint.Resume:
    """The outputs put back to the checkpoint the run resumes from: its own, or, on a node of a run of several
    processes, each of the node's ranks' (the one ``LAUNCHER_RESUME_FROM`` names, which every rank holds) with the
    node's and its ranks' end records removed; the first of those checkpoints. Raises NotResumable."""
    out: Path = args.out
    name = os.environ.get(checkpoint.ENV_RESUME_FROM) or None
    try:
        layout = layout_of(args)
    except RunError:
        layout = None  # said when the run starts
    if layout is None:
        return checkpoint.prepare_resume(out, name)
    if name is None:
        raise checkpoint.NotResumable(f"the ranks of a run of several processes resume from the checkpoint every "
                                      f"rank holds, and {checkpoint.ENV_RESUME_FROM} names none")
    ends = (distributed.RANK_JSON, RANKS_JSON)
    if layout.node_rank != 0:  # node 0's folder is rank 0's
        checkpoint.clear_final(out, ends)
    folders = [checkpoint.prepare_resume(distributed.rank_out(out, rank), name, ends)
               for rank in layout.global_ranks()]
    return folders[0]


def hand_over(out: Path, owner: str) -> None:
    """Give everything under out to owner ("UID:GID"), so the user on the host can read, move
    and delete a run that a root container wrote. Only root can, and only root needs to."""
    uid_s, _, gid_s = owner.partition(":")
    if not (uid_s.isdigit() and gid_s.isdigit()) or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return
    uid, gid = int(uid_s), int(gid_s)
    if uid == 0:
        return
    for top, dirs, files in os.walk(out):
        for name in (*dirs, *files):
            try:
                os.lchown(os.path.join(top, name), uid, gid)
            except OSError:
                pass
    try:
        os.lchown(out, uid, gid)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "explain":
        return explainmod.main(args)
    return run(args)
