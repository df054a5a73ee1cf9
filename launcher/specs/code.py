"""A user's code as the folder it is: which files a run takes, and where the host finds them.

A plain script rarely stands alone: it imports a sibling module or a package beside it. A run of
``path/train.py`` therefore takes the script's project folder (the enclosing git work tree, or
else the script's folder, or ``--code DIR``): the files git would track there (``.gitignore``
respected, as git itself reads it), no byte-code caches, no virtualenvs, nothing launcher writes
(runs/, reports/, .launcher/). Those files are copied into a snapshot named by their code digest
(``~/.cache/launcher/code/<digest>/``), which is what the container mounts read-only: the local
engine mounts the snapshot itself, an SSH host is sent it once by content (like ``--data-from``
datasets) and checks every file before the folder takes its name. The digest is the one the
runtime computes inside the container (:mod:`launcher.runtime.code`), so the manifest names
exactly what was mounted.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from launcher import memo, proc
from launcher.errors import NotFound, UsageError
from launcher.records.records import MOUNTED, CodePlan, GitState
from launcher.runtime import code as codedigest

MAX_FILE_BYTES = 16 << 20
MAX_TOTAL_BYTES = 128 << 20
LAUNCHER_DIRS = ("runs", "reports", ".launcher")


@dataclass(frozen=True)
class CodeTree:
    root: Path
    files: tuple[str, ...]  # relative posix paths
    entry: str  # the script, relative to root ("" for a recipe folder)
    digest: str
    bytes: int
    git: GitState  # {"commit": ..., "dirty": bool} or {} outside git

    def plan(self, local: Path) -> CodePlan:
        """The code plan of this tree mounted from its snapshot at local (launcher.specs.runspec.plan_code)."""
        return {"source": MOUNTED, "local": str(local), "root": str(self.root), "files": len(self.files),
                "bytes": self.bytes, "entry": self.entry, "digest": self.digest, "git": self.git.copy()}


def git_toplevel(path: Path) -> Path | None:
    """The root of the git work tree holding path, or None: asked of git once per folder in a memo.kept()
    block (a run's steps each want the project folder)."""
    return memo.remembered(("git toplevel", os.path.abspath(path)), lambda: _ask_toplevel(path))


def _ask_toplevel(path: Path) -> Path | None:
    done = proc.run(["git", "-C", path, "rev-parse", "--show-toplevel"], check=False)
    return Path(done.out.strip()).resolve() if done.returncode == 0 and done.out.strip() else None


def git_state(path: Path) -> GitState:
    """The commit of the work tree holding path and whether the code under path differs from it:
    changed, untracked or ignored files count (an ignored copy is not committed code either),
    byte-code caches do not. {} outside a git work tree."""
    head = proc.run(["git", "-C", path, "rev-parse", "HEAD"], check=False)
    if head.returncode != 0:
        return {}
    status = proc.run(["git", "-C", path, "status", "--porcelain", "--ignored", "--untracked-files=all", "--",
                       "."], check=False)
    changed = [line[3:] for line in status.out.splitlines() if len(line) > 3]
    dirty = any(not any(codedigest.skipped(part, i < len(parts) - 1) for i, part in enumerate(parts))
                for parts in (c.strip('"').rstrip("/").split("/") for c in changed))
    return {"commit": head.out.strip(), "dirty": dirty}


def _git_listing(root: Path) -> tuple[list[str] | None, bool]:
    """The files git would take under root (tracked, and untracked but not ignored), or None
    without git; and whether root is in a git work tree. A folder outside any work tree gets the
    same rules from a throwaway index."""
    in_tree = False
    try:
        if in_tree := git_toplevel(root) is not None:
            done = proc.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                             "--", "."], check=False)
        else:
            with tempfile.TemporaryDirectory(prefix="launcher-gitdir-") as gd:
                proc.run(["git", "init", "-q", "--bare", gd], check=True)
                done = proc.run(["git", f"--git-dir={gd}", f"--work-tree={root}", "-C", root, "ls-files", "-z",
                                 "--others", "--exclude-standard"], check=False)
    except NotFound:
        return None, in_tree
    if done.returncode != 0:
        return None, in_tree
    return sorted({p for p in done.out.split("\0") if p}), in_tree


def _is_venv(folder: Path) -> bool:
    return (folder / "pyvenv.cfg").is_file()


def select(root: Path, entry: Path | None = None) -> CodeTree:
    """The files of the code folder root that a run takes; entry (a script) must lie inside it."""
    root = root.resolve()
    if not root.is_dir():
        raise NotFound(f"the code folder {root} does not exist", "give an existing folder with --code DIR")
    rel_entry = ""
    if entry is not None:
        entry = entry.resolve()
        if not entry.is_relative_to(root):
            raise UsageError(f"the script {entry} is not inside the code folder {root}",
                             "pick a --code DIR that holds the script")
        rel_entry = entry.relative_to(root).as_posix()
    listing, in_tree = _git_listing(root)
    # outside a work tree git has no commit to name ({}): not asked again (a process) once the listing said so
    ask_git = in_tree or listing is None
    if listing is None:
        listing = [rel for rel, _ in codedigest.iter_files(root)]
    files: list[str] = []
    total = 0
    largest = ("", 0)
    for rel in listing:
        parts = rel.split("/")
        if parts[0] in LAUNCHER_DIRS or any(codedigest.skipped(p, True) for p in parts[:-1]):
            continue
        if codedigest.skipped(parts[-1], False):
            continue
        path = root / rel
        if not path.is_file():  # deleted but still tracked, a dangling link, a socket
            continue
        if any(_is_venv(root.joinpath(*parts[:i])) for i in range(1, len(parts))):
            continue
        size = path.stat().st_size
        total += size
        if size > largest[1]:
            largest = (rel, size)
        files.append(rel)
    if rel_entry and rel_entry not in files:
        raise UsageError(f"the script {rel_entry} is ignored in {root} (.gitignore?)",
                         "run a script that git would track, or choose the folder with --code DIR")
    if largest[1] > MAX_FILE_BYTES:
        raise UsageError(
            f"the code folder {root} holds {largest[0]} ({largest[1] >> 20} MiB); code files are limited to "
            f"{MAX_FILE_BYTES >> 20} MiB",
            "send data with --data-from DIR, add the file to .gitignore, or choose a smaller --code DIR")
    if total > MAX_TOTAL_BYTES:
        raise UsageError(
            f"the code folder {root} holds {total >> 20} MiB in {len(files)} files; a run takes at most "
            f"{MAX_TOTAL_BYTES >> 20} MiB of code",
            "send data with --data-from DIR, add large folders to .gitignore, or choose a smaller --code DIR")
    digest = codedigest.digest_lines([codedigest.file_line(rel, root / rel) for rel in files])
    return CodeTree(root, tuple(files), rel_entry, digest, total, git_state(root) if ask_git else {})


def snapshot(tree: CodeTree, cache_dir: Path) -> Path:
    """A read-only copy of the tree's files under cache_dir/code/<digest>/ (made once per digest).
    The copy is checked against the digest before it takes its name."""
    final = cache_dir / "code" / tree.digest.removeprefix("sha256:")
    if final.is_dir() and codedigest.code_digest(final) == tree.digest:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=final.parent))
    try:
        for rel in tree.files:
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree.root / rel, dest)
            dest.chmod(0o644)
        got = codedigest.code_digest(tmp)
        if got != tree.digest:
            raise UsageError(f"the code in {tree.root} changed while it was being copied",
                             "run again once your editor has saved everything")
        for top, dirs, _ in os.walk(tmp):
            for d in dirs:
                Path(top, d).chmod(0o755)
        tmp.chmod(0o755)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
