"""pejit's benchmark suite: ``python -m pejit.bench [--quick]``.

Compares pejit with ``jax.jit`` (constants as arguments, and closed over),
TFC's ``pejit`` and hand-folded programs on six cases, measures folding
across ``jax.distributed`` processes (case 7), and checks the targets of
issue 5. See ``python -m pejit.bench --help``.
"""
