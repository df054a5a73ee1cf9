"""The in-container runtime: `python -m launcher.runtime run ...`.

Copied into images with only ``launcher/__init__.py`` beside it, so every module here imports
with the standard library alone; numpy and the frameworks are imported lazily when present.
Recipes may use the small helper API in :mod:`launcher.runtime.api`; they do not have to.
"""
