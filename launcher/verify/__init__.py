"""The verify stage: verdicts across runs, the explanations when they differ, and the content-aware
comparison of the files ML code writes (models, logs, TensorFlow files)."""
