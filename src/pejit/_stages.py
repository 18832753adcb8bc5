"""``Lowered`` and ``Compiled``: ``jax.stages`` objects with the folded constants bound."""

from __future__ import annotations

from collections.abc import Callable

from ._program import Specialization


class Lowered:
    """``jax.stages.Lowered`` of a residual program; folded constants bound."""

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
    """``jax.stages.Compiled`` of a residual program; call it like the function."""

    def __init__(self, compiled, spec: Specialization, split: Callable):
        self._compiled = compiled
        self._spec = spec
        self._split = split

    def __call__(self, *args, **kwargs):
        dyn_args, dyn_kwargs = self._split(args, kwargs)
        return self._compiled(*self._spec.consts, *dyn_args, **dyn_kwargs)

    def __getattr__(self, name):
        return getattr(self._compiled, name)
