"""Per call: a deserialized export of a folded program vs pejit's own call.

The workload is the brief's, ``inv(A) @ x + cholesky(A @ A.T) @ x`` with a
constant ``n x n`` matrix ``A``, in the TFC form. One process folds and
exports it (``export_folded``, ``Exported.serialize()`` to a file); then
each variant runs in a fresh process and reports its median per-call time:

* ``pejit``: the folded function itself, ``g(x)``;
* ``exported.call``: the deserialized ``Exported``, called as it is, in a
  process that never imports pejit;
* ``jit(exported.call)``: the same, under ``jax.jit`` (what a deployed
  program usually does).

It also prints the folded bytes, the serialized size, and the time to
deserialize, compile and run the export once (the deploying process's start).

Run: ``python benchmarks/export_call.py --n 1000 [--n 2000 ...]``
"""

import argparse
import os
import subprocess
import sys
import tempfile

_YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="  # JAX issue #39103
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_YNN_OFF}".strip()

TIMER = """
import statistics, time, jax, jax.numpy as jnp
def per_call(f, x, repeat):
    jax.block_until_ready(f(x))
    times = []
    for _ in range(repeat):
        t = time.perf_counter(); jax.block_until_ready(f(x)); times.append(time.perf_counter() - t)
    return statistics.median(times)
"""

SETUP = """
import numpy as np
rng = np.random.default_rng(0)
A = jnp.asarray(3 * np.eye({n}) + rng.standard_normal(({n}, {n})) / np.sqrt({n}), jnp.float32)
x = jnp.asarray(rng.standard_normal({n}), jnp.float32)
"""

FOLD = TIMER + SETUP + """
from pejit import export_folded, pejit
fun = lambda A, x: jnp.linalg.inv(A) @ x + jnp.linalg.cholesky(A @ A.T) @ x
g = pejit(A, x, constant_arg_nums=[0])(fun)
folded = sum(c.nbytes for c in g.specialize(x).consts)
data = export_folded(g)(x).serialize()
open({path!r}, "wb").write(data)
np.save({path!r} + ".x.npy", np.asarray(x))
np.save({path!r} + ".want.npy", np.asarray(fun(A, x)))
print(f"folded {{folded / 2**20:.1f}} MiB, serialized {{len(data) / 2**20:.1f}} MiB")
print(f"pejit: {{per_call(g, x, {repeat}) * 1e3:.3f}} ms")
"""

DEPLOY = TIMER + """
import sys, numpy as np
from jax import export
x = jnp.asarray(np.load({path!r} + ".x.npy"))
t = time.perf_counter()
exported = export.deserialize(bytearray(open({path!r}, "rb").read()))
out = jax.block_until_ready(exported.call(x))
start = time.perf_counter() - t
np.testing.assert_allclose(out, np.load({path!r} + ".want.npy"), rtol=1e-3, atol=1e-3)
assert "pejit" not in sys.modules
call = {call}
print(f"{{{name!r}}}: {{per_call(call, x, {repeat}) * 1e3:.3f}} ms (deserialize, compile, first call {{start:.2f}} s)")
"""


def run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1200)
    if proc.returncode:
        raise SystemExit(proc.stdout + proc.stderr)
    return proc.stdout.strip()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, action="append")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.n or [1000]:
            path = os.path.join(tmp, f"export_{n}.bin")
            print(f"n = {n}")
            print(" ", run(FOLD.format(n=n, path=path, repeat=args.repeat)).replace("\n", "\n  "))
            for name, call in [("exported.call", "exported.call"), ("jit(exported.call)", "jax.jit(exported.call)")]:
                print(" ", run(DEPLOY.format(path=path, call=call, name=name, repeat=args.repeat)))


if __name__ == "__main__":
    main()
