"""Steady-state measurements with TFC's ``pejit``, in a process of their own.

Importing ``tfc`` turns on 64-bit mode for the whole process, so TFC never
shares a process with the other variants. Run as ``python -m
pejit.bench._tfc '<json spec>'`` with a Python that has ``tfc`` installed.
"""

from __future__ import annotations

from ._common import worker_main

import jax
import jax.numpy as jnp
import numpy as np

from . import programs
from ._common import interleaved


def tfc_pejit(*args, **kwargs):
    """TFC's ``pejit``, imported on first use: the import turns on x64."""
    from tfc.utils import pejit

    return pejit(*args, **kwargs)


def linsolve(spec: dict) -> dict:
    A, x = programs.linsolve_data(spec["n"])
    g = tfc_pejit(A, x, constant_arg_nums=[0])(programs.linsolve)
    t = interleaved({"tfc": lambda: g(x)}, min_seconds=spec["min_seconds"], repeat=spec["repeat"])
    return {"tfc": t["tfc"]}


def basis(spec: dict) -> dict:
    x, xi = programs.basis_data(spec["points"], spec["degree"])
    f = lambda x, xi: programs.basis_residual(x, xi, spec["degree"])  # noqa: E731
    g = tfc_pejit(x, xi, constant_arg_nums=[0])(f)
    t = interleaved({"tfc": lambda: g(xi)}, min_seconds=spec["min_seconds"], repeat=spec["repeat"])
    return {"tfc": t["tfc"]}


def basis_utfc(spec: dict) -> dict:
    """TFC's own basis (a custom primitive with a LAPACK-free C++ kernel), all variants."""
    from pejit import pejit
    from tfc import utfc

    t = utfc(spec["points"], 0, spec["degree"] - 1, x0=-1.0, xf=1.0)
    x = np.asarray(t.x)
    xi = np.random.default_rng(1).standard_normal(t.H(t.x).shape[1]) / spec["degree"]

    def residual(x, xi):
        return (t.d2H(x) + t.H(x)) @ xi - jnp.exp(-x) * jnp.cos(3 * x)

    K = jax.block_until_ready(t.d2H(x) + t.H(x))
    rhs = jax.block_until_ready(jnp.exp(-x) * jnp.cos(3 * x))
    xj, xij = jnp.asarray(x), jnp.asarray(xi)
    fns = {
        "jit_args": lambda: jax.jit(residual)(xj, xij),
        "jit_closed": (lambda f: lambda: f(xij))(jax.jit(lambda xi: residual(xj, xi))),
        "tfc": (lambda f: lambda: f(xij))(tfc_pejit(x, xi, constant_arg_nums=[0])(residual)),
        "pejit": (lambda f: lambda: f(xj, xij))(pejit(residual, constant_argnums=0)),
        "hand": (lambda f: lambda: f(K, rhs, xij))(jax.jit(programs.basis_residual_folded)),
    }
    ref = np.asarray(fns["hand"]())
    scale = float(np.max(np.abs(ref))) or 1.0
    errors = {k: float(np.max(np.abs(np.asarray(fn()) - ref))) / scale for k, fn in fns.items()}
    times = interleaved(fns, min_seconds=spec["min_seconds"], repeat=spec["repeat"])
    return {"times": times, "max_abs_error": errors}


def pln(spec: dict) -> dict:
    Y, O, X = programs.pln_data(spec["n"], spec["p"])
    state = programs.pln_init(Y, X)
    try:
        step = tfc_pejit(state, Y, O, X, constant_arg_nums=[1, 2, 3])(programs.pln_step)
        jax.block_until_ready(step(state))
    except Exception as e:  # TFC's pejit does not take pytree arguments
        return {"tfc": None, "error": f"{type(e).__name__}: {e}"[:200]}
    t = interleaved({"tfc": lambda: step(state)}, min_seconds=spec["min_seconds"], repeat=spec["repeat"])
    return {"tfc": t["tfc"]}


if __name__ == "__main__":
    worker_main({"linsolve": linsolve, "basis": basis, "basis_utfc": basis_utfc, "pln": pln})
