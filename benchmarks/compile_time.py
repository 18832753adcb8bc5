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


def lower_compile_seconds(n: int, repeats: int = 3) -> tuple[float, float, int]:
    """Best-of-``repeats`` (lower, compile) seconds and HLO text size at size ``n``."""
    A = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    v = jnp.ones(n, jnp.float32)
    best_lower = best_compile = float("inf")
    for _ in range(repeats):
        f = pejit.pejit(lambda A, v: jnp.cos(A) @ v, constant_argnums=0)
        f.specialize(A, v)  # fold cos(A) outside the timed region
        t0 = time.perf_counter()
        lowered = f.lower(A, v)
        t1 = time.perf_counter()
        lowered.compile()
        t2 = time.perf_counter()
        best_lower, best_compile = min(best_lower, t1 - t0), min(best_compile, t2 - t1)
    return best_lower, best_compile, len(lowered.as_text())


def main() -> None:
    lower_compile_seconds(64, repeats=1)  # warm up JAX and XLA
    results = {n: lower_compile_seconds(n) for n in (256, 8192)}
    for n, (lo, co, text) in results.items():
        print(f"n={n:5d}: lower {lo * 1e3:7.1f} ms  compile {co * 1e3:7.1f} ms  HLO text {text:,} chars")
    small, large = (sum(results[n][:2]) for n in (256, 8192))
    print(f"lower+compile ratio 8192/256: {large / small:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
