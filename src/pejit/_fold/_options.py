"""``FoldOptions``: the switches of pejit's passes, validated when made.

Every pass reads its switch and thresholds from here (the folding trace,
the fold rules, the back end, the residual passes). The persistent cache
keys folded constants on them, ``cache_dir`` and ``progress`` aside
(neither changes a value).
"""

from __future__ import annotations

import dataclasses
import os

#: The values of ``FoldOptions.backend`` (see ``pejit._fold._batch``).
BACKENDS = ("auto", "eager", "compiled")


@dataclasses.dataclass(frozen=True)
class FoldOptions:
    """Switches for pejit's passes, each on by default.

    Turn one off to debug a suspected miscompilation: the result must not
    change, only how much is folded. The passes are described together in
    [How pejit works](how-it-works.md#the-passes).

    Attributes:
      branches: ``cond``/``switch`` with a known index keep only the taken
        branch; with an unknown index, known work in branches is hoisted.
      calls: nested ``jax.jit`` calls with some known inputs (or closed-over
        constants) are specialized through (inlined), so the known work
        inside them folds; ``jax.checkpoint`` bodies are folded in place;
        so are ``custom_jvp``/``custom_vjp`` functions, and the backward
        rules that forward-mode differentiation leaves (``custom_lin``).
      derivatives: a derivative of a pejit function (``jax.grad``,
        ``jax.jvp``, ``jax.vjp``, ... of it) is folded as a function of its
        own, ``jax.jvp`` of the function at the same constants, so the
        constant work of custom derivative rules folds too (see
        `pejit._calls._derivatives`); off, JAX differentiates the residual
        program.
      loops: loop-invariant known work in ``scan``/``while_loop`` bodies is
        hoisted out and folded, and so are carries that stay known.
      rematerialize: cheap expansions of known values stay in the residual
        program instead of becoming large constants, where XLA fuses them
        into their consumers (see ``FUSES_OPERANDS``).
      literals: folded scalars become literals of the residual jaxpr rather
        than inputs; equal folded constants are passed once, and uniform
        ones that only fusing equations read become broadcasts of a literal.
      expansion_ratio: an expansion is kept lazy when its output is more than
        this many times larger than its known inputs ...
      expansion_min_bytes: ... and larger than this many bytes.
      loop_residual_bytes: per loop, the most bytes of per-iteration known
        work (``length x size``) folded into stacked constants; a loop that
        would need more keeps that work in its body.
      backend: how batches of known work are evaluated: ``"auto"`` (a cost
        model picks per batch, see `pejit._fold._batch`), ``"eager"`` (op by
        op) or ``"compiled"`` (one ``jax.jit`` program per batch).
      cache_dir: where folded constants are kept across processes (see
        [Caching across runs](caching.md#caching-across-runs)): a directory,
        ``False`` for no persistent cache, or ``None`` (the default) for the
        ``PEJIT_CACHE_DIR`` environment variable (set but empty: off), else
        ``pejit/`` in JAX's ``jax_compilation_cache_dir``. Not part of the
        cache key.
      progress: show a progress bar of the fold (``tqdm``, the ``progress``
        extra; without it, log lines); ``None`` reads the environment
        variable ``PEJIT_PROGRESS``. Stage timings go to the ``pejit``
        logger either way (see `pejit._fold._progress`).
      affine: regions of the residual program that are affine in the
        dynamic inputs are replaced by one matrix and one offset per output
        where that is cheaper per call (see `pejit._residual._collapse`).
      affine_max_bytes: the most bytes of matrices and offsets one such
        region may store.
      min_gain: a fold is kept only where the work it evaluates costs at
        least this fraction of the program's per-call cost (estimated by
        `pejit._fold._cost`, see ``fold_pays``); elsewhere the program keeps that
        work, as ``jax.jit``'s does, and the report says so. Each loop body,
        branch and custom rule decides for itself. A call's first
        specialization also asks that the fold win back what it adds to the
        first call within 10,000 calls (``fold_repays``). 0 folds everything
        known.
      beside: where a call's fold would cost its first call more than the
        compile it saves (``fold_first``: a factorization and the products
        around it, not a long chain of arithmetic), the first calls run
        ``jax.jit``'s program, the constants passed, while the fold and the
        residual's compile run on a worker thread, from the second call on
        (a function called once pays nothing beside it); the calls after
        it run the folded program. ``specialize``, ``report``, ``lower`` and
        ``explain`` wait for the fold. Off, the first call waits for it.

    Examples:
      >>> import jax.numpy as jnp
      >>> from pejit import FoldOptions, explain
      >>> def f(c, x):
      ...     return jnp.arange(10000.0).reshape(100, 100) * c + x
      >>> c = jnp.float32(2.0)
      >>> lazy = explain(f, c, 1.0, constant_argnums=0)
      >>> stored = explain(f, c, 1.0, constant_argnums=0, fold_options=FoldOptions(rematerialize=False))
      >>> lazy.folded_bytes < 100 < stored.folded_bytes  # the 100x100 expansion is not stored
      True
    """

    branches: bool = True
    calls: bool = True
    derivatives: bool = True
    loops: bool = True
    rematerialize: bool = True
    literals: bool = True
    expansion_ratio: float = 2.0
    expansion_min_bytes: int = 1024
    loop_residual_bytes: int = 64 * 2**20
    backend: str = "auto"
    cache_dir: str | os.PathLike | bool | None = None
    progress: bool | None = None
    affine: bool = True
    affine_max_bytes: int = 16 * 2**20
    min_gain: float = 0.05
    beside: bool = True

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"FoldOptions: backend must be one of {BACKENDS}, got {self.backend!r}")


__all__ = ["FoldOptions"]
