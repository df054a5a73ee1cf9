"""Runs on the host (python3, stdlib only), sent as text by ``Host.list_dir``.

Arguments: a directory and ``1`` (hash regular files) or ``0`` (sizes only). Lstats every
entry under the directory, never following links, and writes one JSON object per line:
path (relative), size, mtime_ns, kind (file | dir | symlink | other), the link's target,
and a file's ``sha256:<hex>`` when asked. Exits 3 when the directory does not exist.
"""

import hashlib
import json
import os
import stat
import sys
from collections.abc import Iterator


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def entries(root: str, want_hash: bool) -> "Iterator[dict[str, object]]":
    """One record per entry under root, in a stable order (the local host calls this in process)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            rec: dict[str, object] = {"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            if stat.S_ISLNK(st.st_mode):
                rec["kind"] = "symlink"
                rec["target"] = os.readlink(full)
            elif stat.S_ISDIR(st.st_mode):
                rec["kind"] = "dir"
            elif stat.S_ISREG(st.st_mode):
                rec["kind"] = "file"
                if want_hash:
                    rec["sha256"] = file_sha256(full)
            else:
                rec["kind"] = "other"
            yield rec


def main(argv: "list[str]") -> int:
    root, want_hash = argv[0], argv[1] == "1"
    if not os.path.isdir(root):
        return 3
    for rec in entries(root, want_hash):
        sys.stdout.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
