"""The run stage: what runs (recipe, code, determinism profile), where it is placed, its life
(ship, start, wait, pull), the manifest that records it, and the store of finished runs."""
