"""The working directory a plain script expects: its own folder and its data, beside what it writes.

A script run as ``python train.py`` in its folder reads that folder's files by relative path
(``torch.load('traindata.pt')``, ``./data/wikitext-2``). Under launcher its working directory is the
run's outputs folder, so that what it writes there comes back. So the runtime shows in that folder each
entry of the script's folder and of the data folder (``--data-from DIR`` / ``--data PATH``) as a symbolic
link to the read-only original: a read by relative path finds it, a write into it fails (read-only), and
what the script writes beside them is its own. The data wins where both hold a name; a name launcher's
runtime writes itself (``logs/``, ``_launcher/``...) or one the outputs already hold is not shown.

The links are the runtime's: it removes them when the script ends (:func:`hide`), and a pull never
collects a link into the code or the data (``launcher.transfers.pull``), so only what the script wrote comes
back as outputs. After a failure whose text names a relative path the script could not read, or a write
into a shown folder, :func:`hint_after_failure` says where the file is or what to do.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

MAX_SHOWN = 4096  # entries linked at most: the links are made before the script's first line
MAX_NAMED = 4
# What the runtime writes into the outputs folder itself (launcher.runtime.outfiles, probes, checkpoints,
# diverge's op trace): never shadowed by a link.
RUNTIME_NAMES = frozenset({"_launcher", "logs", "fingerprints", "metrics.jsonl", "weights", "model", "probes",
                           "checkpoints", "optrace", "__pycache__"})

# patterns, compiled (and cached by re) only when a run failed
# 'data/x.txt' or "data/x.txt" after FileNotFoundError / No such file or directory / does not exist
_MISSING = (r"(?:FileNotFoundError|No such file or directory|does not exist|not found)[^\n]*?"
            r"""['"]((?!/)[^'"\n]+)['"]""")
_READ_ONLY = r"""Read-only file system[^\n]*?['"]((?!/)[^'"\n]+)['"]"""
# a download that could not reach its server: the resolver's or the socket's words (Python, urllib3, requests, curl)
_OFFLINE = (r"Name or service not known|Temporary failure in name resolution|Could not resolve host|"
            r"No address associated with hostname|Network is unreachable|Failed to establish a new connection")
_URL = r"""https?://[^\s'"<>)]+"""


@dataclass
class View:
    """What the working directory shows: link name -> the file it points at; and what it does not."""

    out: Path
    folder: Path | None  # the script's folder
    data: Path | None
    links: dict[str, str] = field(default_factory=dict)
    not_shown: dict[str, str] = field(default_factory=dict)  # name -> why
    more: int = 0  # entries beyond MAX_SHOWN

    def shown_from(self, root: Path | None) -> list[str]:
        if root is None:
            return []
        prefix = str(root) + os.sep
        return [name for name, target in self.links.items() if target.startswith(prefix)]


def _ours(target: str, roots: list[Path]) -> bool:
    return any(target.startswith(str(r) + os.sep) for r in roots)


def show(out: Path, folder: Path | None, data: Path | None) -> View:
    """Link each entry of data, then of the script's folder, into out (see the module's docstring)."""
    view = View(out, folder, data)
    roots = [r for r in (data, folder) if r is not None]
    for root in roots:
        try:
            names = sorted(os.listdir(root))
        except OSError:
            continue
        for name in names:
            if name in view.links:
                continue  # the data's wins
            if name in RUNTIME_NAMES:
                view.not_shown.setdefault(name, "launcher's own name in the outputs")
                continue
            here = out / name
            if os.path.lexists(here):
                if not (here.is_symlink() and _ours(os.readlink(here), roots)):
                    view.not_shown.setdefault(name, "the outputs hold it already")
                    continue
                here.unlink()  # a link of an earlier segment of this run (resumed)
            if len(view.links) >= MAX_SHOWN:
                view.more += 1
                continue
            target = os.path.join(root, name)
            try:
                os.symlink(target, here)
            except OSError as exc:
                view.not_shown.setdefault(name, f"cannot link it: {exc.strerror}")
                continue
            view.links[name] = target
    return view


def hide(view: View) -> None:
    """Remove the links :func:`show` made that are still there as it made them."""
    for name, target in view.links.items():
        here = view.out / name
        try:
            if here.is_symlink() and os.readlink(here) == target:
                here.unlink()
        except OSError:
            pass


def _names(names: list[str], view: View) -> str:
    shown = [n + ("/" if os.path.isdir(view.links[n]) else "") for n in names[:MAX_NAMED]]
    return ", ".join(shown) + (" ..." if len(names) > MAX_NAMED else "")


def notice(view: View, script: str | None = None) -> str | None:
    """One line for the log; None when nothing but the script itself is shown."""
    code, data = view.shown_from(view.folder), view.shown_from(view.data)
    if not data and [n for n in code if n != script] == []:
        return None
    parts = []
    if code:
        parts.append(f"the script's folder ({len(code)}: {_names(code, view)})")
    if data:
        parts.append(f"the data ({len(data)}: {_names(data, view)})")
    line = (f"working directory {view.out}: {' and '.join(parts)} shown read-only beside what the script writes; "
            "only what it writes comes back")
    if view.not_shown:
        first = next(iter(view.not_shown))
        line += f"; not shown: {', '.join(list(view.not_shown)[:MAX_NAMED])} ({view.not_shown[first]})"
    if view.more:
        line += f"; {view.more} more entries not shown (more than {MAX_SHOWN})"
    return line


def hint_after_failure(log_tail: str, view: View) -> str | None:
    """A hint when the failure's text names a relative path the script could not read, wrote into a
    shown (read-only) folder, or could not download a file; None otherwise."""
    return _file_hint(log_tail, view) or download_hint(log_tail, view)


def download_hint(log_tail: str, view: View) -> str | None:
    """When the script died downloading (a server its container could not reach): what it fetched and how
    to give it the file instead; None when the text shows no such failure."""
    offline = re.search(_OFFLINE, log_tail)
    if offline is None:
        return None
    urls = re.findall(_URL, log_tail[:offline.end()])
    what = (f"download {urls[-1].rstrip('.:,;')}, and its container could not reach the server" if urls else
            "reach a server its container cannot reach")
    return (f"the script tried to {what} ({offline.group(0)}): download {'it' if urls else 'what it needs'} "
            "where it can be reached, put it in a folder, send that with --data-from DIR and have the "
            f"script read it from there (the folder's entries are shown in its working directory {view.out})")


def _file_hint(log_tail: str, view: View) -> str | None:
    found = re.search(_READ_ONLY, log_tail)
    if found:
        top = Path(found.group(1).removeprefix("./")).parts[0] if found.group(1).removeprefix("./") else ""
        if top in view.links:
            return (f"{found.group(1)}: {top} is {view.links[top]}, shown read-only in the working directory "
                    f"{view.out}; write to a new file or folder there instead (what the script writes comes back)")
    for found in re.finditer(_MISSING, log_tail):
        rel = found.group(1).removeprefix("./")
        if not rel or ".." in Path(rel).parts or (view.out / rel).exists():
            continue
        top = Path(rel).parts[0]
        for root in (r for r in (view.folder, view.data) if r is not None):
            if (root / rel).exists():
                why = view.not_shown.get(top, "not shown")
                return (f"{found.group(1)} is {root / rel}, not shown in the working directory {view.out} ({why}); "
                        "pass that path")
        return (f"{found.group(1)} is read from the working directory {view.out}, which shows the script's folder and "
                "the data, and neither holds it: put it beside the script, or send its folder with --data-from DIR "
                "(a file another run wrote: --data-from runs/RUN/outputs)")
    return None
