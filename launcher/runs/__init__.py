"""The run stage: a run's life once it is specified (launcher.specs): the project's image made current,
the run placed on its target (launcher.targets) and started, watched, collected, resumed and cleaned; the
plain `docker run` that repeats it; a re-execution rewound to a checkpoint; a saved model explained."""
