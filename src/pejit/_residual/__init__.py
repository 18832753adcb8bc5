"""Partial evaluation to a residual program: fold rules, and the passes over the residual."""
