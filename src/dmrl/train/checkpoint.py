"""Moved to :mod:`dmrl.policies.checkpoint` (a policy saves and loads without the trainer); kept for old importers."""

from dmrl.policies.checkpoint import load_policy, save_policy  # noqa: F401
