"""Training, evaluation, checkpoints and the policy comparison (the only layer that sees every other)."""
