"""Per-call dispatch overhead of a cached pejit specialization vs jax.jit.

A call whose constants are already cached pays for: the memo's check of its
constants (one ``id()`` per constant; a copy of the bytes compared for a
writable NumPy one; a flatten for a pytree one), and the ``jax.jit``
dispatch of the residual program, which checks the dynamic arguments. This
script measures, side by side in one process:

* ``jax.jit``: the original function, jitted, constants passed as arguments;
* ``residual``: the residual program's own ``jax.jit`` runner, called
  directly (the dispatch pejit cannot avoid);
* ``pejit``: the call-time form.

and prints pejit's overhead over both, for 1, 4 and 8 constant leaves, given
as positional ``jax.Array`` arguments, as one dict, and as read-only NumPy
arrays; and the cost of a writable NumPy constant (hashed on every call).
The last column, ``stubbed``, isolates pejit's own Python work: the same
call with the residual runner replaced by a no-op, minus the no-op. On a
loaded machine the side-by-side columns are noisy; ``stubbed`` is not.

Run: ``python benchmarks/dispatch.py``
"""

import os

_YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="  # JAX issue #39103
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_YNN_OFF}".strip()

import timeit  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pejit import pejit  # noqa: E402
from pejit._jit import call_path  # noqa: E402


def best_us(fn, number=1000, repeat=3):
    """Best-of-``repeat`` mean time per call in microseconds."""
    fn()
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def interleaved(fns: dict, rounds=4) -> dict:
    """Best time of each function, measured in alternation (fair under load)."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], best_us(fn))
    return best


def positional(k):
    def f(*args):
        *consts, x = args
        return x + sum(jnp.sin(c).sum() for c in consts)

    return f, tuple(range(k))


def main():
    x = jnp.ones(8)
    arrays = [jnp.full((8,), float(i)) for i in range(8)]
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; times in us per call (best of interleaved runs)")
    print(f"{'case':<36}{'jax.jit':>9}{'residual':>10}{'pejit':>8}{'- jit':>8}{'- residual':>11}{'stubbed':>9}")

    def row(name, pj_call, jit_call, residual_call, spec, cache):
        t = interleaved({"jit": jit_call, "res": residual_call, "pj": pj_call})
        call, memo = spec.call, cache.last[0]
        spec.call = stub = lambda *args: None  # noqa: E731
        cache.last[0] = (*memo[:-1], stub) if memo[-1] is call else memo
        s = interleaved({"pj": pj_call, "stub": lambda: stub(x)})
        spec.call, cache.last[0] = call, memo
        print(f"{name:<36}{t['jit']:9.2f}{t['res']:10.2f}{t['pj']:8.2f}"
              f"{t['pj'] - t['jit']:8.2f}{t['pj'] - t['res']:11.2f}{s['pj'] - s['stub']:9.2f}")

    for k in (1, 4, 8):
        f, nums = positional(k)
        consts = arrays[:k]
        pf = pejit(f, constant_argnums=nums)
        jf = jax.jit(f)
        pf(*consts, x)
        spec = pf.specialize(*consts, x)
        row(f"{k} jax.Array constants", lambda: pf(*consts, x), lambda: jf(*consts, x),
            lambda: spec.call(x), spec, call_path(pf).caches.specializations)

    def g(d, x):
        return x + sum(jnp.sin(v).sum() for v in d.values())

    d = {f"c{i}": arrays[i] for i in range(8)}
    pg, jg = pejit(g, constant_argnums=0), jax.jit(g)
    pg(d, x)
    spec = pg.specialize(d, x)
    row("dict of 8 jax.Array constants", lambda: pg(d, x), lambda: jg(d, x), lambda: spec.call(x), spec,
        call_path(pg).caches.specializations)

    f, nums = positional(8)
    frozen = [np.asarray(a).copy() for a in arrays]
    for a in frozen:
        a.flags.writeable = False
    pf, jf = pejit(f, constant_argnums=nums), jax.jit(f)
    pf(*frozen, x)
    spec = pf.specialize(*frozen, x)
    row("8 read-only NumPy constants", lambda: pf(*frozen, x), lambda: jf(*frozen, x),
        lambda: spec.call(x), spec, call_path(pf).caches.specializations)

    print("\nwritable NumPy constants are hashed (SHA-1) on every call:")
    f, nums = positional(1)
    for n in (8, 1 << 20):
        c = np.ones(n, np.float32)
        pf, jf = pejit(f, constant_argnums=nums), jax.jit(f)
        pf(c, x)
        spec = pf.specialize(c, x)
        row(f"1 writable NumPy constant, {4 * n} B", lambda: pf(c, x), lambda: jf(c, x),
            lambda: spec.call(x), spec, call_path(pf).caches.specializations)


if __name__ == "__main__":
    main()
