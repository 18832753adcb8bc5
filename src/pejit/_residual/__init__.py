"""Partial evaluation to a residual program: fold rules, and the passes over the residual.

``_partial_eval`` runs a function (or replays a jaxpr) under the folding
trace with a ``Folder`` as its policy, then passes over the residual
program it gets: repeated equations dropped (``_cse``), regions affine in
the dynamic inputs collapsed into one matrix each (``_affine`` finds them
with the rules of ``rules/affine.py`` and decides where to cut,
``_collapse`` builds and applies the matrices, ``_linear`` builds them on
the host), equal and uniform constants passed once. ``rules/`` holds the
built-in fold rules, one module per primitive family (branches, calls,
loops, custom derivatives, products): plug-ins of the ``Folder``,
registered with the rest of each primitive's support (its cost, host,
affine and linear rules) when this stage is imported (``rules/builtins.py``,
through ``rules/registry.py``), as a user's rule is by
``pejit.register_fold_rule``.

Imports: ``_reports``, ``_fold`` and ``_compat``.
"""

from . import rules  # noqa: F401  (registers the built-in fold rules)
