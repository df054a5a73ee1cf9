"""The files the runtime writes, relative to the outputs folder.

Their names only, apart from :mod:`launcher.runtime.records` (which re-exports them beside the
documents they hold): the recipe's interpreter needs the names before the recipe's first line, and
the typed documents only when it is type-checked.
"""

RUNTIME_JSON = "_launcher/runtime.json"
EXIT_JSON = "_launcher/exit.json"
RANKS_JSON = "_launcher/ranks.json"  # a node of a run of several processes: how each of its ranks ended
DATASET_JSON = "fingerprints/dataset.json"
ARRAYS_JSON = "fingerprints/arrays.json"
INITIAL_WEIGHTS = "fingerprints/initial_weights.json"
BATCHES = "fingerprints/batches.jsonl"
STEPS = "fingerprints/steps.jsonl"
METRICS = "metrics.jsonl"
LAYERS_JSON = "weights/layers.json"
CANONICAL_MODEL = "model/canonical.npz"
