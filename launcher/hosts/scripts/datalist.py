"""Runs on the host (python3, stdlib only), sent as text by ``datasets.prune_host``.

Argument: the host's data folder. Prints ``<bytes> <age seconds> <name>`` for each entry of
it, sorted by name: the total size of the regular files under the entry (lstat) and the
seconds since the entry itself last changed. Prints nothing when the folder does not exist.
"""

import os
import sys
import time


def tree_bytes(top: str) -> int:
    total = 0
    for d, _, files in os.walk(top):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_size
            except OSError:
                pass
    return total


def main(argv: "list[str]") -> int:
    root = argv[0]
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        names = []
    for name in names:
        top = os.path.join(root, name)
        print(tree_bytes(top), int(time.time() - os.lstat(top).st_mtime), name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
