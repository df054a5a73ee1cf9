"""`launcher attest RUN...`, `launcher attest verify FILE`, `launcher bundle`, `launcher reproduce`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from launcher.cli.common import command, options, render, reporter, stdout, workspace_of
from launcher.cli.hostopts import MaxParallelOpt, PartitionOpt, SchedulerOpt, SlurmOpt, target, with_host
from launcher.cli.params import LauncherGroup, RunsArg, SecretEnvOpt
from launcher.errors import UsageError
from launcher.hosts.hostspec import HostSpec
from launcher.result import Result

if TYPE_CHECKING:
    from launcher.attest.bundle import BundleOutcomeRecord
    from launcher.attest.provenance import AttestOutcomeRecord
    from launcher.workflows.reproduce import ReproduceOutcomeRecord

app = typer.Typer()
LOCAL = HostSpec()  # what a command gets without --host (@with_host passes the real value)

KeyOpt = Annotated[str | None, typer.Option(
    "--key", metavar="FILE", help="The private key to sign with: an SSH key (signed as git signs commits, "
    "ssh-keygen -Y sign, namespace launcher; a .pub whose key ssh-agent holds works too) or an Ed25519/ECDSA PEM "
    "key. Default: signing_key in launcher.toml (LAUNCHER_SIGNING_KEY).")]
AllowedSignersOpt = Annotated[Path | None, typer.Option(
    "--allowed-signers", metavar="FILE", help="An OpenSSH allowed-signers file (as git's gpg.ssh.allowedSignersFile: "
    "'PRINCIPAL namespaces=\"launcher\" ssh-ed25519 AAAA...'): whose SSH signatures count. Default: "
    "LAUNCHER_ALLOWED_SIGNERS, else your own ~/.config/launcher/allowed_signers; never a workspace's launcher.toml "
    "(a project you review could vouch for itself).")]


class DefaultCommandGroup(LauncherGroup):
    """`launcher attest RUN...` and `launcher attest verify FILE`: arguments that name no subcommand go to
    the default one (hidden), so RUN needs no subcommand of its own."""

    default = "runs"

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        first = next((a for a in args if not a.startswith("-")), None)  # global options may come first
        if args and first not in self.commands and not (len(args) == 1 and args[0] in ("-h", "--help")):
            args = [self.default, *args]
        return super().parse_args(ctx, args)


attest_app = typer.Typer(
    name="attest", cls=DefaultCommandGroup, no_args_is_help=True, subcommand_metavar="RUN... | verify FILE",
    help="Signed provenance of runs.\n\n`launcher attest RUN... [--key FILE]` writes each run's in-toto statement "
    "(SLSA Provenance v1; subjects: its outputs) to runs/RUN/attestation/provenance.json and, with a key, signed "
    "to provenance.dsse.json. `launcher attest RUN --help` lists its options.\n\n`launcher attest verify FILE` "
    "checks a signed statement.")
app.add_typer(attest_app)


def _trust(ctx: typer.Context, allowed_signers: Path | None, keys: list[Path] | None, key_option: str) -> Any:
    """What the reviewer trusts, and where it came from (the verdict names it): --allowed-signers, else
    LAUNCHER_ALLOWED_SIGNERS, else the user's own configuration; a workspace's launcher.toml never."""
    from launcher import config
    from launcher.attest.signers import Trust
    from launcher.cli.params import workspace_for

    cfg = config.resolve(workspace_for(ctx))
    origin = "--allowed-signers"
    given = getattr(ctx.get_parameter_source("allowed_signers"), "name", None) == "COMMANDLINE"
    if allowed_signers is not None and not given:
        found = cfg.value("allowed_signers")
        origin = found.origin if found.source == "environment" else "your configuration"
    return Trust.of(allowed_signers, list(keys or []), origin=origin, key_option=key_option,
                    ignored=cfg.ignored_note("allowed_signers"))


def signer_of(key: str | None) -> Any:
    from launcher.attest.signers import load_signer

    return load_signer(key) if key else None


def _print_attested(result: Result[AttestOutcomeRecord]) -> None:
    for r in result.data["runs"]:
        stdout.print(f"{r['run_id']}: {r['subjects']} subjects, {r['envelope'] or r['statement']}", markup=False)
    stdout.print(result.summary, markup=False)


@command(attest_app, "runs", hidden=True, title="attest")
def attest_cmd(
    ctx: typer.Context,
    runs: RunsArg = None,
    key: KeyOpt = None,
) -> None:
    """Write each run's provenance: runs/RUN/attestation/provenance.json (an in-toto Statement v1 whose subjects
    are the run's outputs, with an SLSA Provenance v1 predicate from its manifest) and, with a key,
    provenance.dsse.json (the statement in a signed DSSE envelope).

    Example: launcher attest 20261125T101500-tiny-a1b2c3 --key ~/.ssh/id_ed25519
    """
    from launcher.attest.provenance import attest_runs

    ws = workspace_of(ctx)
    signer = signer_of(key)
    with reporter(ctx) as rep:
        res = attest_runs(ws, list(runs or []), signer, rep)
    render(ctx, Result("attest", res.to_dict(), summary=res.summary_line()), _print_attested)


@command(attest_app, "verify")
def attest_verify_cmd(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(metavar="FILE", help="A signed statement (.dsse.json): a run's "
                                         "provenance, or a reproduction's verification summary; or a bundle "
                                         "(every file and each run's provenance checked).")],
    allowed_signers: AllowedSignersOpt = None,
    public_key: Annotated[list[Path] | None, typer.Option(
        "--key", metavar="PUB", help="A public key whose signatures count: PEM (Ed25519, ECDSA) or an OpenSSH "
        ".pub line; repeatable.")] = None,
    run: Annotated[Path | None, typer.Option(
        "--run", metavar="DIR", help="The run's folder (runs/RUN, or one unpacked from a bundle): check every "
        "file the statement names against its digest, and that its outputs/ holds nothing else. For a "
        "verification summary, the folder must hold the provenance the summary names.")] = None,
    predicate_type: Annotated[str | None, typer.Option(
        "--predicate-type", metavar="TYPE", help="Require this kind of statement: provenance, summary (a "
        "reproduction's verification summary), bundle, or a predicate type URI.")] = None,
    verifier: Annotated[str | None, typer.Option(
        "--verifier", metavar="WHO", help="Require a good signature by WHO: a principal of your allowed signers "
        "(alice@example.com), a key id (SHA256:... or sha256:...) or a --key file; for a verification summary, "
        "the verifier it names.")] = None,
) -> None:
    """Check a signed statement: its signature (by a key you trust), its schema and, with --run, every file.

    Whom you trust comes from --allowed-signers or --key, else LAUNCHER_ALLOWED_SIGNERS, else your own
    ~/.config/launcher/allowed_signers; never from the workspace or project you are checking. The verdict
    names the file or key it trusted.

    Exit codes: 0 valid; 43 no good signature by a key you trust, or not by the --verifier you asked for
    (UNKNOWN_SIGNER); 41 a trusted key's signature does not verify: the statement was changed (BAD_SIGNATURE);
    42 a file differs from its signed digest, is missing, is a link or was added (DIGEST_MISMATCH); 13 not an
    envelope or statement launcher reads, or one naming nothing it can check (CORRUPT); 16 not the
    --predicate-type asked for (INCOMPATIBLE); 21 a bundle entry that leaves its folder (UNSAFE_PATH); 14 a
    bundle larger than the free disk (DISK_FULL); a valid verification summary of a reproduction that did not
    pass: 3 (the outputs differ), 37 (inconclusive), 44 (another image ran it).
    """
    import tarfile

    from launcher.attest.check import require, verify_file

    trust = _trust(ctx, allowed_signers, public_key, "--key")
    if file.is_file() and tarfile.is_tarfile(file):  # a bundle: its signature, every file, each run's provenance
        from launcher.attest.unpack import verify_bundle

        if run is not None:
            raise UsageError(f"--run is for a signed statement; {file} is a bundle, which carries its runs",
                             "drop --run (each bundled run's files are checked), or give a .dsse.json file")

        with reporter(ctx) as rep:
            opened = verify_bundle(file, trust, rep)
        require(opened.bundle, predicate_type, verifier)
        render(ctx, Result("attest verify", {"valid": True, **opened.to_dict()}, summary=opened.summary_line()))
        return
    res = verify_file(file, trust, run, predicate_type=predicate_type, verifier=verifier)
    render(ctx, Result("attest verify", res.to_dict(), exit_code=res.exit_code, summary=res.summary_line()))


def _print_bundle(result: Result[BundleOutcomeRecord]) -> None:
    stdout.print(result.summary, markup=False)


@command(app, "bundle")
def bundle_cmd(
    ctx: typer.Context,
    runs: RunsArg = None,
    out: Annotated[Path, typer.Option("--out", "-o", metavar="FILE", help="The bundle to write (a tar).")] = Path(
        "run.bundle"),
    key: KeyOpt = None,
    with_data: Annotated[bool, typer.Option(
        "--with-data", help="Also carry each run's dataset (one it was sent with --data-from).")] = False,
    without_base: Annotated[bool, typer.Option(
        "--without-base", help="Leave out the pinned base image (its registry must then serve it to the "
        "reviewer). A bootstrapped base cannot be made again: debootstrap from the live archive gives another.")
    ] = False,
) -> None:
    """Write what someone else needs to rebuild the image and rerun the runs, signed: a deterministic tar of
    each run's signed provenance, manifest and outputs, the code that ran, the variant lock, images.lock, the
    Dockerfile, the recipes as the image holds them and the image's config, and the pinned base (its registry
    manifest and layers, checked against its digest). Not the image (it is rebuilt), not the data unless
    --with-data.

    Example: launcher bundle 20261125T101500-tiny-a1b2c3 -o tiny.bundle --key ~/.ssh/id_ed25519
    """
    from launcher.attest.bundle import make_bundle

    ws = workspace_of(ctx)
    signer = signer_of(key)
    with reporter(ctx) as rep:
        res = make_bundle(ws, list(runs or []), out, signer, with_data=with_data, without_base=without_base,
                          reporter=rep)
    render(ctx, Result("bundle", res.to_dict(), summary=res.summary_line()), _print_bundle)


def _print_reproduced(result: Result[ReproduceOutcomeRecord]) -> None:
    d = result.data
    trusted = ", ".join(f"{t.get('allowed_signers') or t.get('key')} (from {t['from']})" for t in d["trusted"])
    stdout.print(f"bundle {d['bundle']}: signed by {', '.join(d['signed_by'])}, trusting {trusted}; base {d['base']}",
                 markup=False)
    image = d["image"]
    same = "the recorded one" if image["same"] else f"NOT the recorded one ({image.get('differs_in')})"
    stdout.print(f"image {image['rebuilt'][7:19]} rebuilt: {same}", markup=False)
    for r in d["runs"]:
        stdout.print(f"{r['original']} -> {r['reproduced']}: {r['verdict']}; signed summary {r['verification']}",
                     markup=False)
    stdout.print(result.summary, markup=False)


@command(app, "reproduce")
@with_host()
def reproduce_cmd(
    ctx: typer.Context,
    bundle: Annotated[Path, typer.Argument(metavar="BUNDLE", help="A bundle `launcher bundle` wrote.")],
    host: HostSpec = LOCAL,
    into: Annotated[Path | None, typer.Option(
        "--into", metavar="DIR", help="The fresh workspace the reproduction is made in (default: BUNDLE's name "
        "with .reproduced).")] = None,
    allowed_signers: AllowedSignersOpt = None,
    trusted_key: Annotated[list[Path] | None, typer.Option(
        "--trusted-key", metavar="PUB", help="A public key whose signatures count (PEM, or an OpenSSH .pub line); "
        "repeatable.")] = None,
    key: KeyOpt = None,
    allow_other_image: Annotated[bool, typer.Option(
        "--allow-other-image", help="Run even when the rebuilt image's ID differs from the recorded one (another "
        "launcher version, another base); the verdict says so.")] = False,
    data_from: Annotated[Path | None, typer.Option(
        "--data-from", metavar="DIR", help="The run's dataset, when the bundle does not carry it.")] = None,
    secret_env: SecretEnvOpt = None,
    run: Annotated[str | None, typer.Option(
        "--run", metavar="RUN", help="Reproduce this run of the bundle only (default: all).")] = None,
    scheduler: SchedulerOpt = None,
    partition: PartitionOpt = None,
    slurm_opt: SlurmOpt = None,
    max_parallel: MaxParallelOpt = None,
) -> None:
    """Repeat a bundled run in a fresh workspace and sign the verdict.

    The bundle's signatures and files are checked first, against whom you trust (--allowed-signers or
    --trusted-key, else LAUNCHER_ALLOWED_SIGNERS, else your own ~/.config/launcher/allowed_signers; never the
    workspace's): nothing is written before its signature is checked, and a bundle changed after signing is
    refused before anything is built. The base is made pullable from the bundle; the image is rebuilt and
    must have the recorded ID (or pass --allow-other-image); the run is repeated on the host (or on its Slurm
    cluster, with the option --scheduler slurm) with the same code, params, seed, profile and arguments (git
    never runs on the bundled code); `verify checksums` compares it with the bundled outputs; the
    reproduction's provenance and an SLSA verification summary (verification.dsse.json, naming your key as
    its verifier) are signed with --key.

    Exit codes: 0 identical; 37 inconclusive; 3 differs; 44 another image (OTHER_IMAGE); 41, 42, 43 the
    bundle's signatures or files (BAD_SIGNATURE, DIGEST_MISMATCH, UNKNOWN_SIGNER); 21 a bundle entry or path
    that leaves its folders, a link, a sparse member, a .git entry (UNSAFE_PATH); 13 not a bundle launcher
    reads (CORRUPT); 14 larger than the free disk (DISK_FULL); 2 no trust root given (USAGE).
    """
    from launcher.specs import userenv
    from launcher.workflows.reproduce import reproduce

    secrets = userenv.parse([], secret_env or []).secret
    trust = _trust(ctx, allowed_signers, trusted_key, "--trusted-key")
    signer = signer_of(key)
    opts = options(ctx)
    sink = None if opts.json else (lambda line: stdout.print(line, markup=False, highlight=False))
    # absolute: the local engine mounts run folders under it, and docker takes no relative mount
    where = (into or bundle.with_name(bundle.stem + ".reproduced")).resolve()
    with host.open(where if host.local else None) as h, reporter(ctx) as rep:
        res = reproduce(bundle, where, target(h, host, scheduler, partition, slurm_opt, max_parallel), trust=trust,
                        signer=signer, host_spec=host,
                        allow_other_image=allow_other_image, data_from=data_from, secret_env=secrets, only=run,
                        reporter=rep, on_log=sink)
    render(ctx, Result("reproduce", res.to_dict(), exit_code=res.exit_code, summary=res.summary_line()),
           _print_reproduced)
