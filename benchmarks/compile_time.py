"""Lower+compile time of pejit's residual program vs. the folded constant's size.

Folded constants reach the compiled program as arguments (device buffers),
not HLO literals, so lowering and compiling ``cos(A) @ v`` with a constant
``A`` should take about as long at n=8192 (256 MiB constant) as at n=256.
Target: ratio <= 1.5 (TFC: 136x).

Run: python benchmarks/compile_time.py
"""

import os

# jaxlib 0.10.2 miscompiles some CPU reductions in its YNN fusion (JAX #39103).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_experimental_ynn_fusion_type=").strip()

import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pejit  # noqa: E402


def lower_compile_seconds(A, v) -> tuple[float, float, int]:
    """(lower, compile) seconds and HLO text size of a fresh pejit of ``cos(A) @ v``."""
    f = pejit.pejit(lambda A, v: jnp.cos(A) @ v, constant_argnums=0)
    f.specialize(A, v)  # fold cos(A) outside the timed region
    t0 = time.perf_counter()
    lowered = f.lower(A, v)
    t1 = time.perf_counter()
    lowered.compile()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, len(lowered.as_text())


def main(sizes=(256, 8192), repeats: int = 7) -> None:
    inputs = {n: (jax.random.normal(jax.random.key(0), (n, n), jnp.float32), jnp.ones(n, jnp.float32)) for n in sizes}
    lower_compile_seconds(*inputs[sizes[0]])  # warm up JAX and XLA
    best = {n: (float("inf"), float("inf"), 0) for n in sizes}
    for _ in range(repeats):  # interleaved, so machine load hits both sizes alike
        for n in sizes:
            lo, co, text = lower_compile_seconds(*inputs[n])
            best[n] = (min(best[n][0], lo), min(best[n][1], co), text)
    for n, (lo, co, text) in best.items():
        print(f"n={n:5d}: lower {lo * 1e3:7.1f} ms  compile {co * 1e3:7.1f} ms  HLO text {text:,} chars")
    small, large = (sum(best[n][:2]) for n in sizes)
    print(f"lower+compile ratio {sizes[1]}/{sizes[0]}: {large / small:.2f} (target <= 1.5), best of {repeats}")


if __name__ == "__main__":
    main()
