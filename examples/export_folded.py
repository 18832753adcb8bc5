"""Fold once, deploy anywhere: export a folded program and run it without pejit.

``inv(A) @ x + cholesky(A @ A.T) @ x`` with a constant ``A``: pejit folds
the inverse and the factorization; ``jax.export`` of the TFC form (or
``pejit.export_folded`` of the call-time form) exports what is left, a
function of ``x`` alone with the folded constants inside the module. The
script serializes it to a file, then loads and calls it in a fresh Python
process that never imports pejit, and compares per-call times.
Run: ``python examples/export_folded.py --n 1000``.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_experimental_ynn_fusion_type="

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import export  # noqa: E402

from pejit import export_folded, pejit  # noqa: E402

#: What the deploying process runs: JAX alone, the exported file, the inputs.
DEPLOY = """
import statistics, sys, time
import jax, jax.numpy as jnp, numpy as np
from jax import export

exported = export.deserialize(bytearray(open(sys.argv[1], "rb").read()))
call = jax.jit(exported.call)  # under jit: one dispatch per call
x = jnp.asarray(np.load(sys.argv[2]))
np.save(sys.argv[3], np.asarray(call(x)))
times = []
for _ in range(int(sys.argv[4])):
    t = time.perf_counter(); jax.block_until_ready(call(x)); times.append(time.perf_counter() - t)
assert "pejit" not in sys.modules
print(f"deployed per call: {statistics.median(times) * 1e3:.3f} ms")
"""


def fun(A, x):
    return jnp.linalg.inv(A) @ x + jnp.linalg.cholesky(A @ A.T) @ x


def per_call(f, x, repeat):
    """Median seconds per call, timed as DEPLOY times the exported program."""
    jax.block_until_ready(f(x))
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(f(x))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    A = jnp.asarray(3 * np.eye(args.n) + rng.standard_normal((args.n, args.n)) / np.sqrt(args.n), jnp.float32)
    x = jnp.asarray(rng.standard_normal(args.n), jnp.float32)

    # TFC form: a function of x alone, so jax.export exports the folded program.
    g = pejit(A, x, constant_arg_nums=[0])(fun)
    exported = export.export(g)(x)
    # The call-time form exports the same program through export_folded,
    # specialized to the constants given.
    f = pejit(fun, constant_argnums=0)
    np.testing.assert_array_equal(export_folded(f)(A, x).call(x), exported.call(x))

    module = exported.mlir_module()
    print(f"exported: in_avals {exported.in_avals}, "
          f"{'no custom call' if 'custom_call' not in module else 'CUSTOM CALLS LEFT'} in the module")
    assert "custom_call" not in module  # no LAPACK call: the folded work is gone
    folded = sum(c.nbytes for c in g.specialize(x).consts)
    data = exported.serialize()
    print(f"folded constants {folded / 2**20:.2f} MiB, serialized export {len(data) / 2**20:.2f} MiB")

    with tempfile.TemporaryDirectory() as tmp:
        path, x_file, out_file = (os.path.join(tmp, name) for name in ("g.jax_exported", "x.npy", "out.npy"))
        with open(path, "wb") as file:
            file.write(data)
        np.save(x_file, np.asarray(x))
        proc = subprocess.run([sys.executable, "-c", DEPLOY, path, x_file, out_file, str(args.repeat)],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode:
            raise SystemExit(proc.stdout + proc.stderr)
        print(proc.stdout.strip())
        deployed = np.load(out_file)
    np.testing.assert_allclose(deployed, g(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(deployed, fun(A, x), rtol=1e-3, atol=1e-3)
    print("the deployed process agrees with pejit and with fun(A, x)")
    print(f"pejit per call: {per_call(g, x, args.repeat) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
