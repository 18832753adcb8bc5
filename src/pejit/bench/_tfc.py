"""Steady-state measurements with TFC's ``pejit``, in a process of their own.

Importing ``tfc`` turns on 64-bit mode for the whole process, so TFC never
shares a process with the other variants. Run as ``python -m
pejit.bench._tfc '<json spec>'`` with a Python that has ``tfc`` installed.
"""

from __future__ import annotations

from ._common import worker_main

import logging
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from . import programs
from ._common import interleaved, paired_ratios, rounds


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


def pde_problem(n: int, m: int):
    """A TFC PDE least squares: the 3-D wave equation on an ELM basis.

    ``u_xx + u_yy - u_tt / 4 = 0`` on ``[0,1]^3`` with ``u = 0`` on the
    x and y faces, ``u = sin(pi x) sin(pi y)`` and ``u_t = 0`` at ``t = 0``,
    written the way TFC's examples write it: a constrained expression built
    from ``mtfc``'s basis ``H`` and nested ``egrad``; one Gauss-Newton step
    ``xi - lstsq(J, L)`` (exact, the residual being linear in ``xi``) with
    the three coordinate arrays constant. Returns ``step(xi, *x)``, ``xi``
    and ``x``.
    """
    from tfc import mtfc
    from tfc.utils import egrad

    t = mtfc([n, n, n], -1, m, dim=3, basis="ELMTanh", x0=[0.0, 0.0, 0.0], xf=[1.0, 1.0, 1.0])
    H = t.H
    x = tuple(np.asarray(c) for c in t.x)
    zero, one = np.zeros_like(x[0]), np.ones_like(x[0])

    def g(xi, *x):
        return jnp.dot(H(*x), xi)

    def u1(xi, *x):
        return g(xi, *x) - (1.0 - x[0]) * g(xi, zero, x[1], x[2]) - x[0] * g(xi, one, x[1], x[2])

    def u2(xi, *x):
        return u1(xi, *x) - (1.0 - x[1]) * u1(xi, x[0], zero, x[2]) - x[1] * u1(xi, x[0], one, x[2])

    def u(xi, *x):
        initial = jnp.sin(np.pi * x[0]) * jnp.sin(np.pi * x[1])
        return u2(xi, *x) + initial - u2(xi, x[0], x[1], zero) - x[2] * egrad(u2, 3)(xi, x[0], x[1], zero)

    def L(xi, *x):
        return (egrad(egrad(u, 1), 1)(xi, *x) + egrad(egrad(u, 2), 2)(xi, *x)
                - 0.25 * egrad(egrad(u, 3), 3)(xi, *x))

    def step(xi, *x):
        return xi - jnp.linalg.lstsq(jax.jacfwd(L, 0)(xi, *x), L(xi, *x))[0]

    xi = np.zeros(H(*x).shape[1])
    return step, xi, x, L


def wave_problem(n: int, m: int):
    """TFC's own example, ``WaveEquation2D.py`` (Carl Leake's dissertation,
    chapter 4), in its author's formulation, written anew here.

    The same 3-D wave equation as :func:`pde_problem`, spelled as the
    example spells it: the boundary terms evaluate the basis at
    ``jnp.zeros_like(x[k])`` and ``jnp.ones_like(x[k])`` made inside the
    constrained expression (five calls, each evaluated again by every
    derivative), ``mtfc``'s coordinates as it returns them (``jax.Array``),
    the residual ``u_xx + u_yy - 64 u_tt`` and TFC's ``LS`` step with
    ``method="lstsq"``: ``lstsq(jacfwd(L), -L, rcond=None)[0]``, which ``LS``
    folds with TFC's ``pe`` and ``jax.jit`` (TFC's ``pejit``). Returns
    ``step(xi, *x)``, ``xi``, ``x`` and ``L``.
    """
    from tfc import mtfc
    from tfc.utils import egrad

    t = mtfc([n, n, n], -1, m, dim=3, basis="ELMTanh", x0=jnp.array([0.0, 0.0, 0.0]),
             xf=jnp.array([1.0, 1.0, 1.0]))
    H, x = t.H, t.x

    def faces_x(xi, a, b, c):  # zero on the x = 0 and x = 1 faces
        return (jnp.dot(H(a, b, c), xi) - (1.0 - a) * jnp.dot(H(jnp.zeros_like(a), b, c), xi)
                - a * jnp.dot(H(jnp.ones_like(a), b, c), xi))

    def faces_xy(xi, a, b, c):  # and on the y faces
        return (faces_x(xi, a, b, c) - (1.0 - b) * faces_x(xi, a, jnp.zeros_like(b), c)
                - b * faces_x(xi, a, jnp.ones_like(b), c))

    faces_xy_t = egrad(faces_xy, 3)

    def u(xi, a, b, c):  # and the initial value and rate at t = 0
        return (faces_xy(xi, a, b, c) + jnp.sin(np.pi * a) * jnp.sin(np.pi * b)
                - faces_xy(xi, a, b, jnp.zeros_like(c)) - c * faces_xy_t(xi, a, b, jnp.zeros_like(c)))

    u_xx, u_yy, u_tt = (egrad(egrad(u, k), k) for k in (1, 2, 3))

    def L(xi, *x):
        return u_xx(xi, *x) + u_yy(xi, *x) - 64.0 * u_tt(xi, *x)

    def step(xi, *x):
        return jnp.linalg.lstsq(jax.jacfwd(L, 0)(xi, *x), -L(xi, *x), rcond=None)[0]

    xi = jnp.zeros(H(*x).shape[1])
    return step, xi, x, L


#: The PDE's formulations (case 9): the bench's own, and TFC's example as its author wrote it.
PDE_PROBLEMS = {"bench": pde_problem, "wave2d": wave_problem}

#: The variants of the first-result comparison (case 9), each in a fresh process.
PDE_VARIANTS = ("pejit_call", "pejit", "tfc", "jax.jit")


def _pde_fold(spec: dict, variant: str, step, xi, x):
    """``variant``'s function of ``xi`` alone (specializing on its first call): ``"tfc"``, ``"pejit"``
    (the TFC form), ``"pejit_call"`` (the call-time form, the README's first example) or ``"jax.jit"``."""
    if variant == "tfc":
        return tfc_pejit(xi, *x, constant_arg_nums=[1, 2, 3])(step)
    if variant == "jax.jit":  # compiles everything, folds nothing
        f = jax.jit(step)
        return lambda xi: f(xi, *x)
    from pejit import pejit

    if variant == "pejit_call":
        f = pejit(step, constant_argnums=(1, 2, 3))
        xj = tuple(jnp.asarray(c) for c in x)
        out = lambda xi: f(xi, *xj)  # noqa: E731
        out.specialize = lambda xi: f.specialize(xi, *xj)
        return out
    return pejit(xi, *x, constant_arg_nums=[1, 2, 3])(step)


def pde(spec: dict) -> dict:
    """Per call: TFC's pejit, pejit and a hand-folded step, in this process."""
    step, xi, x, L = pde_problem(spec["n"], spec["m"])
    xij = jnp.asarray(xi)
    tfc = _pde_fold(spec, "tfc", step, xi, x)
    pj = _pde_fold(spec, "pejit", step, xi, x)
    from pejit import pejit

    pj_call = pejit(step, constant_argnums=(1, 2, 3))
    # by hand: the residual is affine in xi, L(xi) = A xi + b, and the
    # least-squares solution operator of A is a constant
    A = jax.jacfwd(L, 0)(xij, *x)
    b = L(jnp.zeros_like(xij), *x)
    P = jnp.linalg.pinv(A)
    hand = jax.jit(lambda P, A, b, xi: xi - P @ (A @ xi + b))
    fns = {"tfc": lambda: tfc(xij), "pejit": lambda: pj(xij), "pejit_calltime": lambda: pj_call(xij, *x),
           "hand": lambda: hand(P, A, b, xij)}
    ref = np.asarray(fns["tfc"]())
    scale = float(np.max(np.abs(ref))) or 1.0
    errors = {k: float(np.max(np.abs(np.asarray(fn()) - ref))) / scale for k, fn in fns.items()}
    samples = rounds(fns, min_seconds=spec["min_seconds"], repeat=spec["rounds"])
    return {
        "times": {k: statistics.median(v) for k, v in samples.items()},
        "ratios": paired_ratios(samples, "tfc") | {
            f"{k}/hand": paired_ratios(samples, "hand")[k] for k in ("pejit", "pejit_calltime")
        },
        "max_rel_error_vs_tfc": errors,
        "unknowns": int(xi.shape[0]),
        "equations": int(A.shape[0]),
    }


def ode_problem(points: int, m: int):
    """TFC's nonlinear ODE example: ``y'' + y y' = f(x)`` on ``[0, pi]``, ``y(0) = y(pi) = 0``.

    ``f`` is chosen so that ``y = exp(-x) sin(x)``. Written as TFC's
    examples write it: ``utfc``'s Chebyshev basis ``H``, a constrained
    expression meeting both boundary conditions for every ``xi``, ``egrad``
    for the derivatives, and one Gauss-Newton step ``xi - lstsq(J, L)`` with
    the points ``x`` constant. The residual is nonlinear in ``xi`` (``y y'``).
    """
    from tfc import utfc
    from tfc.utils import egrad

    t = utfc(points, 2, m, basis="CP", x0=0.0, xf=np.pi)
    H = t.H
    x = np.asarray(t.x)

    def y(x, xi):
        zero, end = jnp.zeros_like(x), jnp.full_like(x, np.pi)
        return (jnp.dot(H(x), xi) - (1.0 - x / np.pi) * jnp.dot(H(zero), xi)
                - (x / np.pi) * jnp.dot(H(end), xi))

    yd = egrad(y)
    ydd = egrad(yd)

    def L(xi, x):
        exact = jnp.exp(-x) * jnp.sin(x)
        f = -2 * jnp.exp(-x) * jnp.cos(x) + exact * jnp.exp(-x) * (jnp.cos(x) - jnp.sin(x))
        return ydd(x, xi) + y(x, xi) * yd(x, xi) - f

    def step(xi, x):
        return xi - jnp.linalg.lstsq(jax.jacfwd(L, 0)(xi, x), L(xi, x))[0]

    xi = np.zeros(H(x).shape[1])
    return step, xi, x, y


def ode(spec: dict) -> dict:
    """Per call: TFC's pejit and pejit (both forms) on the nonlinear ODE step, in this process."""
    from pejit import pejit

    step, xi, x, y = ode_problem(spec["points"], spec["m"])
    xij = jnp.asarray(xi) + 0.01
    tfc = tfc_pejit(xi, x, constant_arg_nums=[1])(step)
    pj = pejit(xi, x, constant_arg_nums=[1])(step)
    pj_call = pejit(step, constant_argnums=1)
    fns = {"tfc": lambda: tfc(xij), "pejit": lambda: pj(xij), "pejit_calltime": lambda: pj_call(xij, x)}
    solved = {}
    for k, f in (("tfc", tfc), ("pejit", pj)):  # Newton's iterations converge to y = exp(-x) sin(x)
        sol = xij
        for _ in range(8):
            sol = f(sol)
        solved[k] = float(np.max(np.abs(np.asarray(y(x, sol)) - np.exp(-x) * np.sin(x))))
    ref = np.asarray(fns["tfc"]())
    scale = float(np.max(np.abs(ref))) or 1.0
    errors = {k: float(np.max(np.abs(np.asarray(fn()) - ref))) / scale for k, fn in fns.items()}
    samples = rounds(fns, min_seconds=spec["min_seconds"], repeat=spec["rounds"])
    report = pj.report(xij)
    return {
        "times": {k: statistics.median(v) for k, v in samples.items()},
        "ratios": paired_ratios(samples, "tfc"),
        "max_rel_error_vs_tfc": errors,
        "max_error_vs_exact_solution": solved,
        "residual_equations": report.residual_eqns,
        "collapsed": [str(c) for c in report.collapsed],
    }


def pde_fold(spec: dict) -> dict:
    """Time to the first result (fold, compile, first call) and peak RSS of one variant, in a fresh process;
    with ``spec["per_call"]`` seconds, then its time per call (not ``jax.jit``'s: its call is the whole
    computation) and, for pejit, the fold's breakdown (:func:`_fold_breakdown`).

    ``peak_bytes`` is the process's peak RSS (``VmHWM``: TFC's problem set-up
    included, as ``resource.getrusage`` would report it), ``peak_increase_bytes``
    its rise from the level before ``pejit(...)``.
    """
    from ._worker import _reset_peak_rss, _status_bytes, _warm_runtime

    step, xi, x, _ = PDE_PROBLEMS[spec.get("problem", "bench")](spec["n"], spec["m"])
    _warm_runtime()
    log = _PejitLog()
    logger = logging.getLogger("pejit")
    logger.addHandler(log)
    logger.setLevel(logging.DEBUG)
    before = _reset_peak_rss()
    start = time.perf_counter()
    f = _pde_fold(spec, spec["variant"], step, xi, x)
    out = jax.block_until_ready(f(xi))
    seconds = time.perf_counter() - start
    result = {
        "seconds": seconds,
        "peak_bytes": _status_bytes("VmHWM"),
        "peak_increase_bytes": _status_bytes("VmHWM") - before,
        "checksum": float(np.sum(np.asarray(out, np.float64))),
    }
    if spec.get("per_call") and spec["variant"] != "jax.jit":  # jax.jit's call is the whole computation
        xij = jnp.asarray(xi)
        result["per_call_seconds"] = interleaved({"f": lambda: f(xij)}, min_seconds=spec["per_call"], repeat=3)["f"]
    if spec["variant"] not in ("tfc", "jax.jit"):  # what the persistent cache has to hold (case 10)
        specialization = f.specialize(xi)
        result["folded_bytes"] = sum(int(np.asarray(c).nbytes) for c in specialization.consts)
        result["breakdown"] = _fold_breakdown(specialization.report, log.lines)
    return result


class _PejitLog(logging.Handler):
    """The ``pejit`` logger's lines: its stages (trace, fold) and what each batch wrote and kept."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage().split(": ", 1)[-1])


def _fold_breakdown(report, lines: list[str]) -> dict:
    """The fold's time by stage: tracing and folding in all, and per batch its
    segments' evaluation and compile seconds and the logger's line."""
    per_batch: dict[int, dict] = {}
    for b in report.batches:
        row = per_batch.setdefault(b.batch, {"equations": 0, "seconds": 0.0, "compile_seconds": 0.0})
        row["equations"] += b.equations
        row["seconds"] += b.seconds
        row["compile_seconds"] += b.compile_seconds
    for row, line in zip(per_batch.values(), [line for line in lines if line.startswith("batch of")]):
        row["log"] = line
    first = "folding program: first value"  # the call-time form's evaluation of its folding program
    return {"fold_seconds": report.fold_seconds, "batches": list(per_batch.values()),
            "first_value": [line.removeprefix(first + ", ") for line in lines if line.startswith(first)],
            "stages": [line for line in lines if not line.startswith(("batch of", first))],
            "residual_equations": report.residual_eqns, "collapsed": [str(c) for c in report.collapsed]}


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
    worker_main({"linsolve": linsolve, "basis": basis, "basis_utfc": basis_utfc, "pln": pln,
                 "pde": pde, "pde_fold": pde_fold, "ode": ode})
