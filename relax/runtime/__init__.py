"""The Ray runtime: roles, the advantages deployment, the data plane, checkpoints, metrics."""
