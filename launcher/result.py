"""Results that commands return and only the CLI renders.

``--json`` prints :meth:`Result.envelope`: a versioned envelope around plain data, so
scripts and tests read data, not screen text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypedDict, TypeVar

from launcher.errors import ExitCode

ENVELOPE_SCHEMA = "launcher.result/v1"


class Envelope(TypedDict):
    """What ``--json`` prints: the schema, the command, whether it succeeded, and its data."""

    schema: str
    command: str
    ok: bool
    exit_code: int
    summary: str
    data: Mapping[str, object]  # each command's own JSON payload (an error's: {"error": message}), only dumped


# Each command's own JSON payload: the producer's record (a TypedDict, mostly), which the command's renderer
# reads with its fields' types and --json dumps as it is.
D = TypeVar("D", bound=Mapping[str, object])


@dataclass
class Result(Generic[D]):
    command: str
    data: D
    exit_code: ExitCode = ExitCode.OK
    summary: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == ExitCode.OK

    def envelope(self) -> Envelope:
        return {
            "schema": ENVELOPE_SCHEMA,
            "command": self.command,
            "ok": self.ok,
            "exit_code": int(self.exit_code),
            "summary": self.summary,
            "data": self.data,
        }


def error_envelope(command: str, code: ExitCode, message: str) -> Envelope:
    return {
        "schema": ENVELOPE_SCHEMA,
        "command": command,
        "ok": False,
        "exit_code": int(code),
        "summary": message,
        "data": {"error": message},
    }
