"""``Lowered`` and ``Compiled``: ``jax.stages`` objects with the folded constants bound."""

from __future__ import annotations

from collections.abc import Callable

from ._program import Specialization


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

    def __init__(self, lowered, spec: Specialization, split: Callable):
        self._lowered = lowered
        self._spec = spec
        self._split = split

    def compile(self, *args, **kwargs) -> Compiled:
        return Compiled(self._lowered.compile(*args, **kwargs), self._spec, self._split)

    def with_split(self, split: Callable) -> Lowered:
        """This lowering, whose compiled form maps its call's arguments to the
        residual program's with ``split(args, kwargs) -> (dyn_args, dyn_kwargs)``."""
        return Lowered(self._lowered, self._spec, split)

    def __getattr__(self, name):
        return getattr(self._lowered, name)


class Compiled:
    """``jax.stages.Compiled`` of a residual program; call it like the function.

    The arguments are those of the function (constants included, which must
    be the values it was specialized for); the folded constants are passed
    for you. Other attributes are ``jax.stages.Compiled``'s.
    """

    def __init__(self, compiled, spec: Specialization, split: Callable):
        self._compiled = compiled
        self._spec = spec
        self._split = split

    def __call__(self, *args, **kwargs):
        dyn_args, dyn_kwargs = self._split(args, kwargs)
        return self._compiled(*self._spec.consts, *dyn_args, **dyn_kwargs)

    def __getattr__(self, name):
        return getattr(self._compiled, name)
