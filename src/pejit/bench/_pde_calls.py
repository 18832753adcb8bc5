"""Case 15's worker: TFC's PDE step per call right after the fold, against the
hand-folded program, in a Python with ``tfc`` (64-bit, as TFC sets it).

Each variant (form x grid) runs in a fresh process: the hand-folded program
is compiled first, then the variant folds, and its first calls alternate
with the hand-folded program's, one by one, so that whatever the fold left
running (worker threads, compiles ahead, frees) slows the variant's calls
and not the reference's. Then the steady state, in paired rounds.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from ._common import paired, worker_main
from ._tfc import pde_problem

#: The variants: (form, grid).
VARIANTS = (("TFC form", "NumPy"), ("TFC form", "jax.Array"), ("call-time form", "NumPy"),
            ("call-time form", "jax.Array"))

#: Calls after the fold that count as "right after" it.
FIRST_CALLS = 1000


def pde_calls(spec: dict) -> dict:
    from pejit import pejit

    step, xi, x, L = pde_problem(spec["n"], spec["m"])
    xij = jnp.asarray(xi)
    # by hand: the step is affine in xi, xi - pinv(A) (A xi + b) = M xi + c
    A = jax.jacfwd(L, 0)(xij, *x)
    b = L(jnp.zeros_like(xij), *x)
    P = jnp.linalg.pinv(A)
    M, c = jnp.eye(xij.shape[0]) - P @ A, -P @ b
    hand = jax.jit(lambda M, c, v: M @ v + c)
    hand(M, c, xij).block_until_ready()
    form, grid = spec["form"], spec["grid"]
    consts = x if grid == "NumPy" else tuple(jnp.asarray(v) for v in x)
    start = time.perf_counter()
    if form == "TFC form":
        f = pejit(xi, *consts, constant_arg_nums=[1, 2, 3])(step)
        call = lambda: f(xij)  # noqa: E731
    else:
        g = pejit(step, constant_argnums=(1, 2, 3))
        call = lambda: g(xij, *consts)  # noqa: E731
    out = call()
    out.block_until_ready()
    fold = time.perf_counter() - start
    error = float(jnp.max(jnp.abs(out - hand(M, c, xij))) / jnp.max(jnp.abs(out)))
    ours, theirs = [], []
    for _ in range(FIRST_CALLS):
        t = time.perf_counter()
        call().block_until_ready()
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        hand(M, c, xij).block_until_ready()
        theirs.append(time.perf_counter() - t)
    steady = paired({"pejit": call, "hand": lambda: hand(M, c, xij)}, "hand", 200, spec["pairs"])
    return {
        "fold_seconds": fold, "max_rel_error": error,
        "first": {"pejit": statistics.median(ours), "hand": statistics.median(theirs),
                  "ratio": statistics.median(a / b for a, b in zip(ours, theirs))},
        "steady": {"pejit": steady["times"]["pejit"], "hand": steady["times"]["hand"],
                   "ratio": steady["ratio"]["pejit"]},
    }


if __name__ == "__main__":
    worker_main({"pde_calls": pde_calls})
