"""Results that commands return and only the CLI renders.

``--json`` prints :meth:`Result.envelope`: a versioned envelope around plain data, so
scripts and tests read data, not screen text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

from launcher.errors import ExitCode

ENVELOPE_SCHEMA = "launcher.result/v1"


class Envelope(TypedDict):
    """What ``--json`` prints: the schema, the command, whether it succeeded, and its data."""

    schema: str
    command: str
    ok: bool
    exit_code: int
    summary: str
    data: dict[str, Any]  # each command's own JSON payload (an error's: {"error": message})


@dataclass
class Result:
    command: str
    data: dict[str, Any] = field(default_factory=dict)  # each command's own JSON payload
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
