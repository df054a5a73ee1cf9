"""Results out: reports over experiment groups (statistics, figures) and exports to MLflow and
TensorBoard."""
