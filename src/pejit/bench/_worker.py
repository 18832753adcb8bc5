"""Cold-process measurements: fold time, compile time, peak memory.

Run as ``python -m pejit.bench._worker '<json spec>'`` by the driver, one
fresh process per sample, so that no variant profits from caches another
one warmed (JAX caches per-primitive executables per process). JAX's own
start-up is paid before the clock starts.
"""

from __future__ import annotations

import time

from ._common import worker_main

import jax
import jax.numpy as jnp
import numpy as np

from . import programs


def _warm_runtime():
    jax.block_until_ready(jnp.zeros(3) + 1)  # backend start-up, not folding


def fold_time(spec: dict) -> dict:
    """Seconds from creating the specialized function to its first result.

    ``program`` is ``"chain"`` (the light chain, then ``+ x``, NumPy constant,
    call-time form) or ``"sin_chain"`` (``c = sin(c) * 1.001 + 0.5``, then ``@ x``, a
    ``jax.Array`` constant, TFC form).
    """
    N, K, variant = spec["N"], spec["K"], spec["variant"]
    sin_chain = spec.get("program", "chain") == "sin_chain"
    f, known = (programs.sin_chain if sin_chain else programs.chain)(K)
    A = np.random.default_rng(0).standard_normal((N, N)).astype(np.float32)
    x = np.ones(N, np.float32) if sin_chain else np.float32(1.0)
    if sin_chain:
        A, x = jax.block_until_ready((jnp.asarray(A), jnp.asarray(x)))
    _warm_runtime()
    if variant == "tfc":
        from tfc.utils import pejit as tfc_pejit
    elif variant != "one_program":
        from pejit import FoldOptions, pejit
    start = time.perf_counter()
    if variant == "one_program":
        # the known part as one compiled program, then the residual
        k = jax.jit(known)(A)
        out = jax.jit(lambda k, x: k @ x if sin_chain else k + x)(k, x)
    elif variant == "tfc":
        out = tfc_pejit(A, x, constant_arg_nums=[0])(f)(x)
    elif sin_chain:
        out = pejit(A, x, constant_arg_nums=[0])(f)(x)
    else:
        backend = {"pejit": "auto", "pejit_eager": "eager", "pejit_compiled": "compiled"}[variant]
        out = pejit(f, constant_argnums=0, fold_options=FoldOptions(backend=backend))(A, x)
    jax.block_until_ready(out)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "checksum": float(np.asarray(out, np.float64).sum())}


def first_calls(spec: dict) -> dict:
    """Case 8: the first ``calls`` calls of ``ridge_loss`` in a cold process, and the first alone."""
    from pejit import pejit

    X, y = (jnp.asarray(a) for a in programs.ridge_data())
    rng = np.random.default_rng(1)
    params = [jnp.asarray(rng.standard_normal(X.shape[1]).astype(np.float32)) for _ in range(spec["calls"])]
    _warm_runtime()
    jax.block_until_ready(params)
    make = {"auto": lambda f: pejit(f, constant_argnums="auto"),
            "explicit": lambda f: pejit(f, constant_argnums=(1, 2)), "jax.jit": jax.jit}[spec["variant"]]
    start = time.perf_counter()
    fn = make(programs.ridge_loss)
    first = jax.block_until_ready(fn(params[0], X, y))
    first_seconds = time.perf_counter() - start
    for p in params[1:]:
        out = fn(p, X, y)
    jax.block_until_ready(out)
    return {"seconds": time.perf_counter() - start, "first_seconds": first_seconds,
            "checksum": float(np.asarray(first, np.float64))}


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak_rss() -> int:
    """Reset the peak-RSS mark (Linux) and return the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS")


def compile_memory(spec: dict) -> dict:
    """Fold ``cos(A)`` (n x n): fold, compile, and peak-memory figures."""
    n, variant = spec["n"], spec["variant"]
    A = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    x = np.ones(n, np.float32)
    if variant != "tfc":
        # a device array: pejit keys NumPy constants by a SHA-1 of their
        # content, which is not what this case measures
        A = jax.block_until_ready(jnp.asarray(A))
    _warm_runtime()
    before = _reset_peak_rss()
    start = time.perf_counter()
    if variant == "tfc":
        from tfc.utils import pejit
    else:
        from pejit import pejit
    g = pejit(A, x, constant_arg_nums=[0])(programs.cos_matvec)
    folded = time.perf_counter()
    lowered = g.lower(x)
    lowered_t = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    out = compiled(x)
    jax.block_until_ready(out)
    peak = _status_bytes("VmHWM")
    return {
        "fold_s": folded - start,
        "lower_s": lowered_t - folded,
        "compile_s": done - folded,
        "peak_increase_bytes": peak - before,
        "folded_bytes": n * n * 4,
    }


if __name__ == "__main__":
    worker_main({"fold_time": fold_time, "compile_memory": compile_memory, "first_calls": first_calls})
