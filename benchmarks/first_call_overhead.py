"""What pejit adds to a small program's first call, apart from XLA's compile (issue 72).

Most programs of ``benchmarks/first_call.py`` compile in 20-60 ms, where the
fresh processes it measures move by up to 50% from run to run; pejit's own
part of such a first call (its call path, the look at jax.jit's trace, the
report) is a millisecond or two, which that noise hides. Here each round makes a
new function (nothing cached) of a program that folds nothing worth a fold, at
a new shape, and times its first call under ``jax.jit`` and under pejit,
rotating which goes first. JAX's own monitoring events give the time XLA
spent compiling (``backend_compile_duration``); the rest (trace, lowering,
pejit's look, dispatch) is what pejit can add to. Printed per program: the
median first call and the median time outside the compile of each variant,
and the median over rounds of pejit's time minus ``jax.jit``'s, both whole
and outside the compile. A third variant keeps the constants out of the
program (``FoldOptions(literals=False)``): what compiling them in, as
``jax.jit`` compiles the arrays a function closes over, adds to the first
call (it is what makes later calls as fast as ``jax.jit``'s with them closed
over). A fourth is the TFC form, made on the clock before its first call.

With ``--fresh`` each variant's first call runs in a process of its own, as
a user's script meets it: it then also pays what a first call runs for the
first time in a process (pejit's modules' first calls, JAX's paths that
``jax.jit`` alone does not take); ``import pejit`` is paid before the clock.

``--numpy`` passes the arguments as NumPy arrays, as a script that builds
its data with NumPy does.

Run: ``python benchmarks/first_call_overhead.py [--rounds 30] [--fresh] [--numpy]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

# jaxlib 0.10.2 miscompiles some CPU reductions in its YNN fusion (JAX #39103).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_experimental_ynn_fusion_type=").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pejit import FoldOptions, NothingFoldedWarning, pejit  # noqa: E402

#: Programs of the corpus (``tests/test_corpus.py``), the first argument constant.
PROGRAMS = {
    "jnp.outer": lambda x, y: jnp.outer(x[0], y[1]),
    "jnp.exp": lambda x, y: (jnp.exp(x), jnp.exp(y)),
    "jnp.tri": lambda x, y: jnp.tri(3, x.shape[1]) * x + y,
}


_COMPILING = [0.0]  # seconds XLA spent compiling since the last reset


def _count_compiles(event: str, seconds: float, **_) -> None:
    if event.endswith("backend_compile_duration"):
        _COMPILING[0] += seconds


jax.monitoring.register_event_duration_secs_listener(_count_compiles)


def first_call(make, fun, *args) -> tuple[float, float]:
    """The first call's seconds, and those of it XLA spent compiling."""
    _COMPILING[0] = 0.0
    start = time.perf_counter()
    jax.block_until_ready(make(fun)(*args))
    return time.perf_counter() - start, _COMPILING[0]


VARIANTS = {"jax.jit": jax.jit, "pejit": lambda f: pejit(f, constant_argnums=0),
            "pejit, literals=False": lambda f: pejit(f, constant_argnums=0, fold_options=FoldOptions(literals=False)),
            # made on the clock, as a TFC user's script makes it before its first call
            "pejit, TFC form": lambda f: lambda x, y: pejit(x, y, constant_arg_nums=[0])(f)(y)}


def _arguments(r: int, numpy: bool) -> tuple:
    rng = np.random.default_rng(r)
    arrays = tuple(rng.uniform(-2, 2, (3, 4 + r)).astype(np.float32) for _ in range(2))
    return arrays if numpy else jax.block_until_ready(tuple(map(jnp.asarray, arrays)))


def _once(name: str, variant: str, r: int, numpy: bool) -> tuple[float, float]:
    program = PROGRAMS[name]
    fun = lambda x, y: program(x, y)  # noqa: E731 - a new function each round: nothing cached
    return first_call(VARIANTS[variant], fun, *_arguments(r, numpy))


def _fresh(name: str, variant: str, r: int, numpy: bool) -> tuple[float, float]:
    cmd = [sys.executable, __file__, "--worker", json.dumps([name, variant, r, numpy])]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return tuple(json.loads(out.splitlines()[-1]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--fresh", action="store_true", help="each first call in a process of its own")
    parser.add_argument("--numpy", action="store_true", help="the arguments NumPy arrays, not jax.Arrays")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", NothingFoldedWarning)
    if args.worker:
        print(json.dumps(_once(*json.loads(args.worker))))
        return
    if not args.fresh:
        for make in VARIANTS.values():  # each variant's first compile in this process, before the clock
            first_call(make, lambda x, y: x * y, *_arguments(100, args.numpy))
    run = _fresh if args.fresh else _once
    for name in PROGRAMS:
        times: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
        for r in range(args.rounds):
            order = list(VARIANTS)
            for v in order[r % len(order):] + order[: r % len(order)]:
                times[v].append(run(name, v, r, args.numpy))
        jit = times["jax.jit"]
        parts = [f"{name}: jax.jit {_ms(jit, _total)} ({_ms(jit, _outside)} outside the compile)"]
        for v in list(VARIANTS)[1:]:
            added = statistics.median(p[0] - j[0] for p, j in zip(times[v], jit))
            added_outside = statistics.median(_outside(p) - _outside(j) for p, j in zip(times[v], jit))
            parts.append(f"{v} {_ms(times[v], _total)} ({_ms(times[v], _outside)} outside), adds {added * 1e3:.1f} "
                         f"ms ({added_outside * 1e3:.1f} ms outside the compile)")
        print("; ".join(parts) + f"; medians of {args.rounds} rounds" + (", fresh processes" if args.fresh else "")
              + (", NumPy arguments" if args.numpy else ""))


def _total(t: tuple[float, float]) -> float:
    return t[0]


def _outside(t: tuple[float, float]) -> float:
    return t[0] - t[1]


def _ms(times: list, part) -> str:
    return f"{statistics.median(map(part, times)) * 1e3:.1f} ms"


if __name__ == "__main__":
    main()
