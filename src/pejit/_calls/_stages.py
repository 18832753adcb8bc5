"""``Traced``, ``Lowered`` and ``Compiled``: ``jax.stages`` objects of a specialization.

Each serves the constant values it was specialized for, and no others: a
call with other constants raises rather than silently running the old fold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax

from .. import _compat


class Traced(jax.stages.Traced):
    """``jax.stages.Traced`` of a specialization: the function of the arguments traced.

    What ``.trace`` of a pejit function with constants returns. Its closed
    jaxpr carries the folded constants as its constants; in the call-time
    form the constant arguments are inputs that it leaves unused (their
    leaves that are not arrays appear as ``None``), in the TFC form they are
    not inputs at all. Lowering it embeds the folded constants in the
    module, as ``jax.jit`` does with the arrays a function closes over
    (``.lower()`` of the pejit function passes them as buffers instead).

    Calling it, or what ``lower().compile()`` gives, takes the arguments of
    the function (constants included, which must be the values traced);
    ``jax.export`` of the call-time form raises, naming
    [`export_folded`][pejit.export_folded]: the fold is right for these
    constant values only.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from pejit import pejit
      >>> f = pejit(lambda A, x: jnp.linalg.inv(A) @ x, constant_argnums=0)
      >>> A = 2 * jnp.eye(2)
      >>> traced = f.trace(A, jnp.ones(2))
      >>> [a.shape for a in traced.jaxpr.in_avals]  # the function's signature; A is unused
      [(2, 2), (2,)]
      >>> traced.lower().compile()(A, jnp.full(2, 4.0))
      Array([2., 2.], dtype=float32)
      >>> traced.lower().compile()(3 * jnp.eye(2), jnp.ones(2))
      Traceback (most recent call last):
      ValueError: this compiled function was specialized for other constant values; lower and compile again for the new ones
    """

    # The trace's own state is JAX's (copied in by :func:`_compat.as_traced`).
    __slots__ = ("_split", "_export_error")

    @classmethod
    def of(cls, traced: jax.stages.Traced, split: Callable, export_error: str | None) -> Traced:
        """Wrap JAX's trace. ``split(args, kwargs)`` checks a call's constants and
        returns the arguments of the trace; ``export_error``, if given, is what
        ``jax.export`` of the trace raises."""
        new = _compat.as_traced(traced, cls)
        new._split = split
        new._export_error = export_error
        return new

    def lower(self, **kwargs) -> Lowered:
        if self._export_error is not None and _compat.lowering_for_export(kwargs):
            raise ValueError(self._export_error)
        return Lowered(super().lower(**kwargs), self._split)

    # JAX's trace can be called (evaluating its jaxpr) from 0.9 on; this one
    # then too, its constants checked first.
    if _compat.TRACED_IS_CALLABLE:

        def __call__(self, *args, **kwargs):
            args, kwargs = self._split(args, kwargs)
            return super().__call__(*args, **kwargs)


class Lowered:
    """``jax.stages.Lowered`` of a residual program, its folded constants bound.

    What ``Pejitted.lower`` returns. Every attribute of ``jax.stages.Lowered``
    (``as_text``, ``cost_analysis``, ...) is the residual program's;
    ``compile`` gives a [`Compiled`][pejit.Compiled], called like the
    function itself, constants included, which it checks: a compiled
    program serves only the constant values it was specialized for.

    Examples:
      >>> import jax.numpy as jnp
      >>> from pejit import pejit
      >>> f = pejit(lambda A, x: jnp.linalg.inv(A) @ x, constant_argnums=0)
      >>> A = 2 * jnp.eye(2)
      >>> lowered = f.lower(A, jnp.ones(2))
      >>> "lu" in lowered.as_text()  # the inverse was folded
      False
      >>> lowered.compile()(A, jnp.ones(2))
      Array([0.5, 0.5], dtype=float32)
    """

    def __init__(self, lowered, split: Callable, consts: Sequence = ()):
        """``split(args, kwargs)`` checks a call and returns the arguments the
        lowered program takes after ``consts`` (the folded constants it is passed)."""
        self._lowered = lowered
        self._split = split
        self._consts = consts

    def compile(self, *args, **kwargs) -> Compiled:
        return Compiled(self._lowered.compile(*args, **kwargs), self._split, self._consts)

    def __getattr__(self, name):
        return getattr(self._lowered, name)


class Compiled:
    """``jax.stages.Compiled`` of a residual program; call it like the function.

    The arguments are those of the function (constants included, which must
    be the values it was specialized for); the folded constants are passed
    for you. Other attributes are ``jax.stages.Compiled``'s.
    """

    def __init__(self, compiled, split: Callable, consts: Sequence = ()):
        self._compiled = compiled
        self._split = split
        self._consts = consts

    def __call__(self, *args, **kwargs):
        args, kwargs = self._split(args, kwargs)
        return self._compiled(*self._consts, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._compiled, name)
