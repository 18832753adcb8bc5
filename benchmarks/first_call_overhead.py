"""What pejit adds to a small program's first call, in a warm process (issue 72).

Most programs of ``benchmarks/first_call.py`` compile in 20-60 ms, where the
fresh processes it measures move by up to 50% from run to run; pejit's own
part of such a first call (its call path, the look at jax.jit's trace, the
report) is a few milliseconds, which that noise hides. Here each round makes a
new function (nothing cached) of a program that folds nothing worth a fold, at
a new shape, and times its first call under ``jax.jit`` and under pejit,
rotating which goes first; what is printed is the median over rounds of
pejit's time minus ``jax.jit``'s, and their ratio. A third variant keeps the
constants out of the program (``FoldOptions(literals=False)``): what compiling
them in, as ``jax.jit`` compiles the arrays a function closes over, adds to the
first call (it is what makes later calls as fast as ``jax.jit``'s with them
closed over). A fresh process pays once more what the first call imports (not
counted here).

Run: ``python benchmarks/first_call_overhead.py [--rounds 30]``
"""

from __future__ import annotations

import argparse
import os
import statistics
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


def first_call(make, fun, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(make(fun)(*args))
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", NothingFoldedWarning)
    variants = {"jax.jit": jax.jit, "pejit": lambda f: pejit(f, constant_argnums=0),
                "pejit, literals=False": lambda f: pejit(f, constant_argnums=0, fold_options=FoldOptions(literals=False))}
    for make in variants.values():  # each variant's first compile in this process, before the clock
        first_call(make, lambda x, y: x * y, jnp.ones(2), jnp.ones(2))
    for name, program in PROGRAMS.items():
        times: dict[str, list[float]] = {v: [] for v in variants}
        for r in range(args.rounds):
            rng = np.random.default_rng(r)
            x, y = (jnp.asarray(rng.uniform(-2, 2, (3, 4 + r)), jnp.float32) for _ in range(2))
            order = list(variants)
            for v in order[r % 3:] + order[: r % 3]:
                fun = lambda x, y: program(x, y)  # noqa: E731 - a new function each round: nothing cached
                times[v].append(first_call(variants[v], fun, x, y))
        jit = statistics.median(times["jax.jit"])
        parts = [f"{name}: jax.jit {jit * 1e3:.1f} ms"]
        for v in list(variants)[1:]:
            added = statistics.median(p - j for p, j in zip(times[v], times["jax.jit"]))
            parts.append(f"{v} {statistics.median(times[v]) * 1e3:.1f} ms (adds {added * 1e3:.1f} ms, "
                         f"ratio {statistics.median(times[v]) / jit:.2f})")
        print(", ".join(parts) + f"; medians of {args.rounds} rounds")


if __name__ == "__main__":
    main()
