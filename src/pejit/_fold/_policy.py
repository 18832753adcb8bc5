"""``FoldPolicy``: the contract between the staging trace and what drives it.

:class:`~pejit._fold._staging.StagingTrace` hands every primitive application to a
policy and asks it about values Python and NumPy want; :class:`~pejit._fold._folding.Folder`
is the policy pejit folds with, and ``explain`` uses one that folds nothing
(:mod:`pejit._calls._unfolded`). The protocol lives here, below both sides, so
that neither imports the other to name it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from jax.extend.core import Primitive


class FoldPolicy(Protocol):
    """What :class:`~pejit._fold._staging.StagingTrace` asks of its policy.

    ``trace`` is the :class:`~pejit._fold._staging.StagingTrace` asking.
    :class:`~pejit._fold._folding.Folder` is the policy pejit folds with;
    ``explain`` uses one that folds nothing.
    """

    def __call__(self, trace: Any, prim: Primitive, args: Sequence[Any], params: dict) -> Any:
        """A primitive application: its outputs, or ``NotImplemented`` to stage it."""

    def call_inputs(self, trace: Any, args: Sequence[Any]) -> list[Any]:
        """The inputs a ``custom_jvp``/``custom_vjp`` call sees: concrete
        values (then JAX folds the call) or ``args`` as they are."""

    def concrete_value(self, tracer: Any) -> Any:
        """The value Python asks of a staged ``tracer`` (``bool``, ``int``,
        ``float``), or None if it has none."""

    def numpy_value(self, tracer: Any) -> Any:
        """The whole array NumPy asks of a staged ``tracer`` (``np.asarray``,
        boolean masks), or None if it has none."""

    def finalize(self, jaxpr: Any, consts: list[Any]) -> tuple[Any, list[Any]]:
        """The traced ``jaxpr`` and its ``consts``, with the known values it
        uses turned into constants: what the trace returns."""


__all__ = ["FoldPolicy"]
