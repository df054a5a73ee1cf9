"""Results that commands return and only the CLI renders.

``--json`` prints :meth:`Result.envelope`: a versioned envelope around plain data, so
scripts and tests read data, not screen text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launcher.errors import ExitCode

ENVELOPE_SCHEMA = "launcher.result/v1"


@dataclass
class Result:
    command: str
    data: dict[str, Any] = field(default_factory=dict)
    exit_code: ExitCode = ExitCode.OK
    summary: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == ExitCode.OK

    def envelope(self) -> dict[str, Any]:
        return {
            "schema": ENVELOPE_SCHEMA,
            "command": self.command,
            "ok": self.ok,
            "exit_code": int(self.exit_code),
            "summary": self.summary,
            "data": self.data,
        }


def error_envelope(command: str, code: ExitCode, message: str) -> dict[str, Any]:
    return {
        "schema": ENVELOPE_SCHEMA,
        "command": command,
        "ok": False,
        "exit_code": int(code),
        "summary": message,
        "data": {"error": message},
    }
