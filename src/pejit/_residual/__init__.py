"""Partial evaluation to a residual program: fold rules, and the passes over the residual."""

from . import rules  # noqa: F401  (registers the built-in fold rules)
