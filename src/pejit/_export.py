"""Deploying a folded program: :func:`export_folded`.

A folded program is right for the constant values it was folded for, and
only for them. The TFC form's signature says so (the constants are gone
from it), so ``jax.export.export`` of a TFC-form function exports the folded
program. The call-time form's signature takes the constants: an export of
it would either ignore them (wrong for any other value) or not fold. So
``jax.export`` of its concrete trace raises, and this explicit entry point
exports, for either form, the specialization of the arguments given as a
function of the dynamic arguments alone, its folded constants inside the
module: a ``jax.export.Exported`` that serializes and runs without pejit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from ._auto import AutoPejitted
from ._jit import Pejitted, call_path
from ._tfc import BoundPejitted, core_call


def export_folded(
    fun: Pejitted | BoundPejitted, *, platforms: Sequence[str] | None = None, disabled_checks: Sequence[Any] = (),
) -> Callable[..., jax.export.Exported]:
    """Export the folded program of a pejit function, for the constants given.

    Called like ``jax.export.export(fun, ...)``, with the function's
    arguments (constants as values; dynamic arguments as arrays or
    ``jax.ShapeDtypeStruct``). The ``jax.export.Exported`` it returns is a
    function of the dynamic arguments alone, **specialized to these constant
    values**: they are folded into the module, which keeps none of the work
    on them (no LAPACK call of a folded factorization). It serializes with
    ``Exported.serialize()`` and runs in a process that never imports pejit
    (``jax.export.deserialize(data).call(*dynamic_args)``). Of a TFC-form
    function it is ``jax.export.export(fun)``. ``platforms`` and
    ``disabled_checks`` are ``jax.export.export``'s.

    The folded constants become literals of the StableHLO module: the
    serialized size is about the folded bytes (a flatbuffer, at most 2 GiB),
    and compiling the deserialized module takes longer as they grow (see
    [Deploying a folded program](export.md)).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from pejit import export_folded, pejit
      >>> f = pejit(lambda A, x: jnp.linalg.inv(A) @ x, constant_argnums=0)
      >>> exported = export_folded(f)(2 * jnp.eye(2), jnp.ones(2))
      >>> exported.in_avals, "lapack" in exported.mlir_module()
      ((ShapedArray(float32[2]),), False)
      >>> jax.export.deserialize(exported.serialize()).call(jnp.full(2, 4.0))
      Array([2., 2.], dtype=float32)
    """
    if isinstance(fun, AutoPejitted):
        raise TypeError(
            "export_folded: constant_argnums='auto' chooses its constants call by call; "
            "give them with constant_argnums (or the TFC form) to export a folded program"
        )
    if not isinstance(fun, (Pejitted, BoundPejitted)):
        raise TypeError(f"export_folded takes a function made by pejit or pe, got {type(fun).__name__}")

    def do_export(*args, **kwargs) -> jax.export.Exported:
        if isinstance(fun, BoundPejitted):
            path, args = core_call(fun, args, kwargs)
            kwargs = {}
        else:
            path = call_path(fun)
        jitted, dyn_args, dyn_kwargs = path.folded(args, kwargs)
        export = jax.export.export(jitted, platforms=platforms, disabled_checks=disabled_checks)
        return export(*dyn_args, **dyn_kwargs)

    return do_export
