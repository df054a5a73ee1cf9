"""Where runs go: the Placement a run's life reaches its target through (containers on one host's engine,
a Slurm cluster's job arrays), the registry of targets by name, and a Slurm cluster's settings and facts."""
