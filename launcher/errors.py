"""One base exception and named exit codes.

The CLI turns a :class:`LauncherError` into one line (problem, then fix) and its exit
code in exactly one place; the core raises and never prints or exits.
"""

from __future__ import annotations

import re
from enum import IntEnum

# Terminal control sequences in captured output (colours, cursor moves, titles, hyperlinks) and the
# other C0 controls: an error is read in logs, CI and JSON, where they show as raw "\x1b[31m".
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]"        # CSI: colours, cursor and erase
                   r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC: titles, hyperlinks
                   r"|\x1b[ -/]*[0-~]"                   # the other escapes (charset, keypad...)
                   r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # the rest of C0 but tab, newline, CR


def plain_text(text: str) -> str:
    """text without terminal escape sequences and control characters (tab, newline and CR kept)."""
    return _ANSI.sub("", text)


class ExitCode(IntEnum):
    OK = 0
    FAILURE = 1  # an unexpected internal error: a bug in launcher
    USAGE = 2  # wrong arguments or options
    NOT_REPRODUCIBLE = 3  # the comparison ran and the results differ
    BUILD_FAILED = 4
    HOST_UNREACHABLE = 5
    RUN_FAILED = 6  # the recipe ran and exited non-zero
    LOCK_FAILED = 7
    PIN_MISMATCH = 8  # an image reference without a digest, or one that disagrees with images.lock
    ENGINE_UNAVAILABLE = 9
    REGISTRY_UNAVAILABLE = 10
    NOT_FOUND = 11  # a missing file, run, recipe, variant or image
    HOST_KEY_REJECTED = 12
    CORRUPT = 13  # a file whose hash or content does not match what was recorded
    DISK_FULL = 14
    SCHEMA_TOO_NEW = 15
    INCOMPATIBLE = 16  # e.g. comparing runs of two different recipes
    BAD_DATA = 17
    BAD_RECIPE = 18
    AUTH_FAILED = 19
    HOST_NOT_READY = 20  # Docker missing on the host, no NVIDIA runtime for a GPU variant
    UNSAFE_PATH = 21  # a remote entry that escapes the run directory
    CONNECTION_REFUSED = 22  # the host answers but nothing listens on that port (wrong port)
    NO_GPU = 23  # a GPU variant on a host without a usable NVIDIA GPU
    MISSING_EXTRA = 24  # an optional feature whose packages are not installed (the error names the extra)
    IMAGE_OUT_OF_DATE = 25  # `run --no-build` while the workspace's code, lock or Dockerfile differ from the image
    TRANSFER_CUT = 26  # a transfer to or from a host stopped half-way (the connection went); rerun to resume
    COMMAND_FAILED = 27  # a command launcher ran here or on a host failed (docker load, tar, rm...)
    TIMED_OUT = 28  # a command or a host did not answer in time
    NO_SCHEDULER = 29  # --scheduler slurm on a host without the Slurm client (sbatch)
    SCHEDULER_DOWN = 30  # the cluster's controller does not answer (scontrol ping)
    UNKNOWN_PARTITION = 31  # --partition names no partition of the cluster
    SLURM_REFUSED = 32  # sbatch refuses the job: a --slurm-opt value or a limit of the partition
    NO_CLOUD_CREDENTIALS = 33  # no Azure credentials found (environment, az login, managed identity)
    CLOUD_QUOTA = 34  # the cloud refused: a quota or limit of the subscription was hit
    NOT_OFFERED = 35  # the VM size or image is not offered in that region (to this subscription), or no capacity
    CLOUD_FAILED = 36  # another refusal or failure of the cloud's API; the error names its code
    INCONCLUSIVE = 37  # verify found no difference, but proved nothing: no training output compared, or no determinism
    OUTPUT_DIFFERS = 38  # verify: training agreed (weights, digests, metrics); an output it does not decide differs
    BAD_CONFIG = 40  # launcher.toml or a LAUNCHER_* variable holds a value launcher refuses; the error names it
    BAD_SIGNATURE = 41  # a signature by a trusted key does not verify: the signed statement or bundle was altered
    DIGEST_MISMATCH = 42  # a file differs from the digest a signed statement or bundle names for it (or is missing)
    UNKNOWN_SIGNER = 43  # no signature is by a key the verifier trusts (allowed signers, --key), or none at all
    OTHER_IMAGE = 44  # `reproduce`: the rebuilt image differs from the one the run recorded (--allow-other-image)
    NOT_RESUMABLE = 45  # `resume`: no checkpoint, finished or still running; or training that cannot resume bitwise
    NOT_REPEATED = 46  # `diverge`: a re-execution does not repeat the run it stands for (or their parting)
    INTERRUPTED = 130


# The exit codes of a command that ran to its end: what its result means, decided here and not in the CLI.
def verdict_exit_code(same: bool) -> ExitCode:
    """A comparison that ran: OK when the results are the same, NOT_REPRODUCIBLE when they differ."""
    return ExitCode.OK if same else ExitCode.NOT_REPRODUCIBLE


def run_exit_code(status: str | None, *, ended: bool = True) -> ExitCode:
    """A run by its status: OK when it succeeded, or has not ended (started detached, still running);
    RUN_FAILED when it ended otherwise (failed, cancelled)."""
    return ExitCode.OK if status == "succeeded" or not ended else ExitCode.RUN_FAILED


class LauncherError(Exception):
    """An expected failure: a message naming the problem and a hint naming the fix."""

    exit_code: ExitCode = ExitCode.FAILURE

    def __init__(self, message: str, hint: str | None = None, *, exit_code: ExitCode | None = None) -> None:
        message = plain_text(message)
        super().__init__(message)
        self.message = message
        self.hint = plain_text(hint) if hint is not None else None
        if exit_code is not None:
            self.exit_code = exit_code

    def one_line(self) -> str:
        text = self.message.rstrip(".")
        if self.hint:
            text += f"; fix: {self.hint}"
        return " ".join(plain_text(text).split())


class UsageError(LauncherError):
    exit_code = ExitCode.USAGE


class NotFound(LauncherError):
    exit_code = ExitCode.NOT_FOUND


class NotResumable(LauncherError):
    exit_code = ExitCode.NOT_RESUMABLE


class LockFailed(LauncherError):
    exit_code = ExitCode.LOCK_FAILED


class BuildFailed(LauncherError):
    exit_code = ExitCode.BUILD_FAILED


class PinMismatch(LauncherError):
    exit_code = ExitCode.PIN_MISMATCH


class EngineUnavailable(LauncherError):
    exit_code = ExitCode.ENGINE_UNAVAILABLE


class RegistryUnavailable(LauncherError):
    exit_code = ExitCode.REGISTRY_UNAVAILABLE


class HostUnreachable(LauncherError):
    exit_code = ExitCode.HOST_UNREACHABLE


class ConnectionRefused(HostUnreachable):
    exit_code = ExitCode.CONNECTION_REFUSED


class HostKeyRejected(LauncherError):
    exit_code = ExitCode.HOST_KEY_REJECTED


class AuthFailed(LauncherError):
    exit_code = ExitCode.AUTH_FAILED


class HostNotReady(LauncherError):
    exit_code = ExitCode.HOST_NOT_READY


class NoGpu(HostNotReady):
    exit_code = ExitCode.NO_GPU


class RunFailed(LauncherError):
    exit_code = ExitCode.RUN_FAILED


class Corrupt(LauncherError):
    exit_code = ExitCode.CORRUPT


class DiskFull(LauncherError):
    exit_code = ExitCode.DISK_FULL


class SchemaTooNew(LauncherError):
    exit_code = ExitCode.SCHEMA_TOO_NEW


class Incompatible(LauncherError):
    exit_code = ExitCode.INCOMPATIBLE


class BadData(LauncherError):
    exit_code = ExitCode.BAD_DATA


class BadRecipe(LauncherError):
    exit_code = ExitCode.BAD_RECIPE


class UnsafePath(LauncherError):
    exit_code = ExitCode.UNSAFE_PATH


class NotReproducible(LauncherError):
    exit_code = ExitCode.NOT_REPRODUCIBLE


class MissingExtra(LauncherError):
    exit_code = ExitCode.MISSING_EXTRA


class ImageOutOfDate(LauncherError):
    exit_code = ExitCode.IMAGE_OUT_OF_DATE


class TransferCut(LauncherError):
    exit_code = ExitCode.TRANSFER_CUT


class CommandFailed(LauncherError):
    """A command launcher ran (locally or on a host) exited non-zero; the message names it."""

    exit_code = ExitCode.COMMAND_FAILED


class TimedOut(LauncherError):
    exit_code = ExitCode.TIMED_OUT


class NoScheduler(LauncherError):
    exit_code = ExitCode.NO_SCHEDULER


class SchedulerDown(LauncherError):
    exit_code = ExitCode.SCHEDULER_DOWN


class UnknownPartition(LauncherError):
    exit_code = ExitCode.UNKNOWN_PARTITION


class SlurmRefused(LauncherError):
    exit_code = ExitCode.SLURM_REFUSED


class NoCloudCredentials(LauncherError):
    exit_code = ExitCode.NO_CLOUD_CREDENTIALS


class CloudQuota(LauncherError):
    exit_code = ExitCode.CLOUD_QUOTA


class NotOffered(LauncherError):
    exit_code = ExitCode.NOT_OFFERED


class CloudFailed(LauncherError):
    exit_code = ExitCode.CLOUD_FAILED


class BadConfig(LauncherError):
    """launcher.toml or a LAUNCHER_* environment variable holds a value launcher refuses."""

    exit_code = ExitCode.BAD_CONFIG


class BadSignature(LauncherError):
    """A signature by a trusted key does not verify: what it signed was changed after signing."""

    exit_code = ExitCode.BAD_SIGNATURE


class DigestMismatch(LauncherError):
    """A file differs from (or lacks) the digest a signed statement or bundle names for it."""

    exit_code = ExitCode.DIGEST_MISMATCH


class UnknownSigner(LauncherError):
    """No signature is by a key the verifier trusts (or nothing is signed)."""

    exit_code = ExitCode.UNKNOWN_SIGNER


class OtherImage(LauncherError):
    """`reproduce` rebuilt an image other than the one the run recorded."""

    exit_code = ExitCode.OTHER_IMAGE


class RegistryAuthFailed(AuthFailed):
    """A registry refused the user's Docker credentials, or they cannot be read (a credential helper
    missing or failing, an unreadable config.json)."""


class RegistryLoginNeeded(RegistryAuthFailed):
    """A registry wants credentials and the user's Docker configuration holds none for it."""
