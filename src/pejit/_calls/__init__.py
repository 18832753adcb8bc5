"""The call path: from a call's arguments to its specialization, and the caches on the way.

``_path`` is the path a call takes, and what the API's objects are thin
over: ``make_path`` parses a pejit function's options once (``_info``;
``_argnums`` checks the argument numbers and names) and chooses the path,
``CallPath`` for a function with constant arguments, ``_passthrough``'s
``JitPath`` (``jax.jit`` itself) for one without. In the order a call goes
through it: ``_dispatch`` generates the hot path for each argument layout;
``_keys`` keys a call (``CallKey``: its constants, its dynamic types, its
named axes); ``_cache`` keeps every cached object under one lock; on a
miss, ``_look`` traces the function as ``jax.jit`` does and judges
whether folding can pay, ``_specializer`` folds (once per structure of the
constants, or per value) or runs ``jax.jit``'s program where nothing is
worth folding, or while ``_beside`` folds on a worker thread (where the fold
would cost the first call more than it saves), and ``_persist`` keeps the folded constants on disk across processes
(residual programs written by ``_jaxpr_json``); ``_program`` is what a
specialization is made of (residual program and its runner, folding
program, constants); ``_derivatives`` runs a call under a transformation
(its derivatives folded as functions of their own). Beside them:
``_stages`` (``Traced``, ``Lowered``, ``Compiled``: the staged API's
objects), ``_errors`` (checks and warnings that point at the user's line)
and ``_unfolded`` (the unfolded program ``explain`` shows).

Above this stage, objects of it are used through their public names only
(tests/test_architecture.py checks it).

Imports: ``_residual``, ``_reports``, ``_fold`` and ``_compat``; never the
public surface above it.
"""
