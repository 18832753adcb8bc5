"""The call path: from a call's arguments to its specialization, and the caches on the way.

In the order a call passes through them: ``_info`` parses a pejit
function's options once (``_argnums`` checks the argument numbers and
names); ``_dispatch`` generates the hot path for each argument layout;
``_keys`` keys a call by its constants; ``_cache`` keeps every cached
object under one lock; on a miss, ``_look`` traces the function as
``jax.jit`` does and judges whether folding can pay, ``_specializer``
folds (once per structure of the constants, or per value) or runs
``jax.jit``'s program where nothing is worth folding, and ``_persist`` keeps the
folded constants on disk across processes (residual programs written by
``_jaxpr_json``); ``_program`` is what a specialization is made of
(residual program, folding program, constants). Beside them: ``_stages``
(``Traced``, ``Lowered``, ``Compiled``), ``_errors`` (checks and warnings
that point at the user's line), ``_unfolded`` (the unfolded program
``explain`` shows) and ``_derivatives`` (a call under a transformation:
its derivatives folded as functions of their own).

Imports: ``_residual``, ``_reports``, ``_fold`` and ``_compat``; never the
public surface above it.
"""
