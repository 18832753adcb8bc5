"""pejit's benchmark suite: ``python -m pejit.bench [--quick]``.

Compares pejit with ``jax.jit`` (constants as arguments, and closed over),
TFC's ``pejit`` and hand-folded programs on six cases, measures folding
across ``jax.distributed`` processes (case 7), and checks its targets
(:mod:`pejit.bench.targets`). See ``python -m pejit.bench --help``.
"""
