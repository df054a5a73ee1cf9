"""A plain script runs with the run's outputs folder as its working directory, so what it writes
by a relative path (``model.pt``, ``runs/``) comes back with the run. A relative path to a file
beside the code (``./data/wikitext-2``, as a script run from its own folder expects) then does not
reach it. launcher says so once at the start when the code folder holds folders such a script may
read, and after a failure whose traceback names a relative path that exists in the code folder."""

from __future__ import annotations

import re
from pathlib import Path

MAX_NAMED = 3
# patterns, compiled (and cached by re) only when a run failed
# 'data/x.txt' or "data/x.txt" after FileNotFoundError / No such file or directory / does not exist
_MISSING = (r"(?:FileNotFoundError|No such file or directory|does not exist|not found)[^\n]*?"
            r"""['"]((?!/)[^'"\n]+)['"]""")

_LOOKED_FOR = r"(?m)^(?:AssertionError|FileNotFoundError|NotADirectoryError)\b|No such file or directory"


def data_folders(code_root: Path) -> list[str]:
    """Top-level folders of the code that are not Python packages (a script reads them, it does not
    import them), by name."""
    try:
        entries = sorted(code_root.iterdir())
    except OSError:
        return []
    return [p.name for p in entries if p.is_dir() and not p.name.startswith((".", "_"))
            and not (p / "__init__.py").is_file()]


def notice(code_root: Path, out: Path) -> str | None:
    """One line for the log, or None when the code has no such folder."""
    folders = data_folders(code_root)
    if not folders:
        return None
    named = ", ".join(f"{name}/" for name in folders[:MAX_NAMED]) + (" ..." if len(folders) > MAX_NAMED else "")
    first = folders[0]
    return (f"working directory {out} (the run's outputs: what the script writes there comes back); the code "
            f"is in {code_root}, with {named}: a relative path like ./{first} does not reach it, "
            f"{code_root}/{first} does")


def hint_after_failure(log_tail: str, code_root: Path, out: Path) -> str | None:
    """A hint when the failure's text names a relative path the code folder has and the working
    directory has not; None otherwise."""
    for found in re.finditer(_MISSING, log_tail):
        rel = found.group(1).removeprefix("./")
        if rel and ".." not in Path(rel).parts and (code_root / rel).exists() and not (out / rel).exists():
            return (f"{found.group(1)} is relative to the working directory {out}, not to the code: the file is "
                    f"{code_root / rel}; pass that path, or the folder with --data (then /launcher/data)")
    folders = data_folders(code_root)
    if folders and re.search(_LOOKED_FOR, log_tail):  # a path check that failed without naming the path
        return (f"if the script looked for ./{folders[0]} or another path beside its code: the working directory is "
                f"{out}, the code's {folders[0]}/ is {code_root / folders[0]}; pass that path")
    return None
