"""What a fold reports.

``_report`` builds a ``FoldReport`` from the ``FoldStats`` a fold counted
and its residual program, in one place (``str``, HTML and Graphviz views).

Imports: ``_fold`` and ``_compat``.
"""
