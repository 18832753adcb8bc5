"""What a fold reports, and what folding some inputs would remove.

``_report`` builds a ``FoldReport`` from the ``FoldStats`` a fold counted
and its residual program, in one place (``str``, HTML and Graphviz views);
``_estimates`` estimates, before any fold, the FLOPs per call that folding
some inputs would remove, and how to fold them (``auto``'s promotions).

Imports: ``_fold`` and ``_compat``.
"""
