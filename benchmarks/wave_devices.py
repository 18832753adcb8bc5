"""TFC's WaveEquation2D on a CPU with several devices (issue 64): residual and per call.

On a CPU with two devices (``--xla_force_host_platform_device_count=2``, as users set
it to shard) the fold used to skip the affine collapse: 917 residual equations and
468 MB of folded constants at 11^3 x 650, 103-171x the hand-folded product per call.
This measures both API forms (TFC's ``pejit(xi, *x, constant_arg_nums=...)(LS)`` and
the call-time form) against the hand-folded program ``P @ xi + c`` (``P`` the
Jacobian of the folded function, ``c`` its value at 0): first call, residual
equations, folded bytes, and per call in rounds whose order alternates (ratios are
medians of per-round ratios). 64-bit, as TFC sets it.

Run: ``python benchmarks/wave_devices.py [N M] [--devices D]`` (default 11 650, 2 devices).
"""

import argparse
import os
import statistics
import sys
import time
import timeit

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("n", type=int, nargs="?", default=11)
parser.add_argument("m", type=int, nargs="?", default=650)
parser.add_argument("--devices", type=int, default=2)
parser.add_argument("--rounds", type=int, default=15)
args = parser.parse_args()
os.environ["XLA_FLAGS"] = (f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}"
                           " --xla_cpu_experimental_ynn_fusion_type=").strip()  # the latter: JAX issue #39103

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # as TFC's programs set it (a script: never in the library)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pejit import pejit  # noqa: E402
from pejit.bench._tfc import wave_problem  # noqa: E402

print(f"JAX {jax.__version__}, devices: {jax.devices()}; {args.n}^3 points, {args.m} functions")
step, xi, x, _ = wave_problem(args.n, args.m)
start = time.perf_counter()
tfc_form = pejit(xi, *x, constant_arg_nums=[1, 2, 3])(step)
tfc_form(xi).block_until_ready()
print(f"TFC form: first result {time.perf_counter() - start:.1f} s", flush=True)
xj = tuple(jnp.asarray(c) for c in x)
call_time = pejit(step, constant_argnums=(1, 2, 3))
start = time.perf_counter()
call_time(xi, *xj).block_until_ready()
print(f"call-time form: first result {time.perf_counter() - start:.1f} s", flush=True)
for name, report in (("TFC form", tfc_form.report(xi)), ("call-time form", call_time.report(xi, *xj))):
    print(f"{name}: residual {report.residual_eqns} equations {dict(report.residual.most_common(4))}, "
          f"{len(report.buffers)} folded buffers, {report.folded_bytes / 1e6:.1f} MB")
P = jax.jacfwd(tfc_form)(xi)
c = tfc_form(jnp.zeros_like(xi))
hand = jax.jit(lambda P, c, v: P @ v + c)
print(f"hand-folded: {(P.nbytes + c.nbytes) / 1e6:.1f} MB")
v = xi + 0.1
for got in (tfc_form(v), call_time(v, *xj)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(hand(P, c, v)), rtol=1e-6, atol=1e-8)
fns = {"TFC form": lambda: tfc_form(v), "call-time form": lambda: call_time(v, *xj), "hand-folded": lambda: hand(P, c, v)}
for fn in fns.values():
    fn().block_until_ready()
samples = {k: [] for k in fns}
for r in range(args.rounds):
    for k, fn in (list(fns.items()) if r % 2 else list(fns.items())[::-1]):
        samples[k].append(timeit.timeit(lambda fn=fn: fn().block_until_ready(), number=50) / 50)
for k, s in samples.items():
    ratio = statistics.median(a / b for a, b in zip(s, samples["hand-folded"]))
    print(f"{k}: per call {statistics.median(s) * 1e6:.1f} us, {ratio:.3f}x hand-folded (median of ratios paired by round)")
sys.exit(0)
