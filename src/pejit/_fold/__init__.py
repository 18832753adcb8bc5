"""The folding trace and its back end: known work evaluated, dynamic work staged.

Read first ``_folding``: ``Folder`` is the folding interpreter, a loop over
primitive applications and a table of rules (``_fold_rules``), as in JAX's
autodidax; ``_staging`` is JAX's tracing to a jaxpr that asks it (or any
``FoldPolicy``, ``_policy``) before each equation. Then ``_store``, where known
work waits until something needs its value.

In the order a fold passes through them: the ``Folder`` looks each
primitive up in the fold rules, stages dynamic work and records known work
as recipes (``_recipe``) in its ``Store`` (``_store``), equal folds once
(``_memo``), while the worker starts kernels and compiles loops ahead
(``_schedule``); cheap expansions stay lazy. It reads its switches from
``_options`` and counts into ``_stats``. ``_cost`` is the cost model every
decision of pejit's asks (does this fold, hoist, split, collapse, compile
pay?), from one measure per equation and the profile of the device the
program runs on (``_device``); ``_known`` reads off a jaxpr what folding its
known inputs would save, before anything is evaluated, and ``_nonzero``
which of its integer divisions cannot divide by zero (what XLA may fold).

The store computes values in batches: ``_plan`` splits a batch into
segments and picks a back end for each; ``_batch`` holds the table of back
ends and runs the segments: equation by equation (on the host where NumPy
gives XLA's bits, ``_host``; else by JAX, or staged into a folding program
of abstract constants, ``_abstract``), or as programs, unrolled loops
rolled again, by ``_compiled``; opaque kernels run on a worker thread
(``_offload``); far reads of constant-only values are computed again
(``_refold``), or held while the heap is trimmed (``_trim``); large host
results reuse the memory of dead ones (``_recycle``); results are kept
compact (``_values``). Beside them: ``_primitives`` (the tables of
primitives by kind), ``_progress``, ``_gc``, ``_room`` (room on CPython's
frame stack for a trace), ``_multihost`` and ``_libc`` (the C library's
functions: the trimmer's, and the call path's ``memcmp``).

Imports: ``_compat`` only.
"""
