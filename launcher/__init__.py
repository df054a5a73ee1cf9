"""launcher: reproducible ML training runs, locked, pinned, run and verified.

This module stays import-light: the in-container runtime (``launcher.runtime``) is
copied into images that have only numpy and a framework installed.
"""

__version__ = "0.1.0"
