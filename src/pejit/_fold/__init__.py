"""The folding trace and its back end: known work evaluated, dynamic work staged.

In the order a fold passes through them: ``_staging`` is JAX's tracing to
a jaxpr, with a policy (``_policy``'s ``FoldPolicy``) asked before each
equation; ``_folding``'s ``Folder`` is that policy: it looks the
primitive up in the fold rules (``_fold_rules``), stages dynamic work and
records known work as recipes, keeps cheap expansions lazy, reads its
switches from ``_options`` and counts into ``_stats``. ``_cost`` is the
cost model every decision of pejit's asks (does this fold, hoist, split,
collapse, compile pay?), from one measure per equation and the profile of
the device the program runs on (``_device``); ``_known`` reads off a jaxpr
what folding its known inputs would save, before anything is evaluated.
A recipe (``_recipe``) is known work recorded and not evaluated yet; the
recipes a value needs are evaluated in batches, each split into segments
with a back end apiece (``_plan``) and run by ``_batch``'s table of back
ends, eager or compiled: on the host where NumPy gives XLA's bits
(``_host``); programs, and unrolled loops rolled again, by ``_compiled``; opaque
kernels on a worker thread (``_offload``); far reads
of constant-only values computed again (``_refold``), or held while the
heap is trimmed (``_trim``); results kept compact (``_values``). Beside
them: ``_abstract`` (known values that are tracers, for value-independent
folding programs), ``_primitives`` (the tables of primitives by kind),
``_progress``, ``_gc`` and ``_multihost``.

Imports: ``_compat`` only.
"""
