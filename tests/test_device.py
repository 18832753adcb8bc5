"""The fold decides for the device it targets (issue 64), checked on the CPU by setting
another device's profile (``pejit._fold._device.using``), and on several CPU devices
in a child process (as ``--xla_force_host_platform_device_count`` makes them).

An accelerator's host computes no folded values (they would cross to the device),
but still builds the affine collapse's matrices, whose constants cross once: the
residual of a program affine in its dynamic inputs is one product there too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pejit import FoldOptions, pejit
from pejit._fold import _device, _offload

from ._util import f32_products

rng = np.random.default_rng(0)
C1, C2, C3 = (rng.standard_normal((48, 48)).astype(np.float32) / 7 for _ in range(3))
X = rng.standard_normal(48).astype(np.float32)


def chain(a, b, c, x):
    return a @ jnp.sin(b) @ (jnp.cos(c) @ x) + 0.5 * x


def want(x=X):
    a, b, c = (np.float64(m) for m in (C1, C2, C3))
    return a @ np.sin(b) @ (np.cos(c) @ np.float64(x)) + 0.5 * np.float64(x)


#: An accelerator whose compiled builds are out of reach: only the host's build collapses.
HOST_BUILT_GPU = dataclasses.replace(_device.GPU, build_flops=0.0)


def test_profiles_by_platform():
    assert _device.current() is _device.PROFILES[jax.default_backend()]
    with _device.using(_device.GPU) as gpu:
        assert _device.current() is gpu and not _device.host_computes()
        assert not _offload.Kernels().enabled  # no worker computing folded values on the host
    assert _device.current().platform == jax.default_backend()


@pytest.mark.parametrize("form", ["call-time", "TFC"])
def test_on_an_accelerator_the_host_builds_the_collapse(form):
    with f32_products(), _device.using(HOST_BUILT_GPU):
        if form == "TFC":
            f = pejit(C1, C2, C3, X, constant_arg_nums=[0, 1, 2])(chain)
            spec, call = f.specialize(X), lambda x: f(x)
        else:
            f = pejit(chain, constant_argnums=(0, 1, 2))
            spec, call = f.specialize(C1, C2, C3, X), lambda x: f(C1, C2, C3, x)
        for x in (X, 2 * X - 1):
            np.testing.assert_allclose(call(x), want(x), rtol=2e-5, atol=2e-5)
    residual = spec.residual
    assert [e.primitive.name for e in residual.jaxpr.eqns] == ["dot_general"]  # x's term joined the matrix
    assert residual.report.collapsed
    # nothing large left on the device: the 48x48 matrix, not the three sines and cosines
    assert residual.report.folded_bytes == 48 * 48 * 4


def test_without_a_host_build_an_accelerator_keeps_the_region():
    # a profile whose host builds nothing: the region over the compiled build's reach stays
    with _device.using(dataclasses.replace(HOST_BUILT_GPU, host_build_flops=0.0)):
        spec = pejit(chain, constant_argnums=(0, 1, 2), fold_options=FoldOptions(min_gain=0.0)).specialize(
            C1, C2, C3, X)  # (folded whatever it saves: small, it is compiled in)
    assert not spec.residual.report.collapsed
    assert [e.primitive.name for e in spec.residual.jaxpr.eqns] == ["dot_general", "dot_general", "mul", "add"]


def test_an_accelerator_weighs_fusion_by_its_memory():
    # device memory is fast: a batch's elementwise runs are worth compiling on a CPU
    # (host traffic) sooner than on a GPU
    from pejit._fold import _cost

    big = 256 * 2**20  # bytes an intermediate writes and reads back
    with _device.using(_device.CPU):
        assert _cost.run_compiles(3, big, 1)
    with _device.using(_device.GPU):
        assert not _cost.run_compiles(3, big, 1)


def test_several_cpu_devices_collapse_as_one_does():
    """With two CPU devices (``--xla_force_host_platform_device_count``) the host
    computes no folded values (an eager result keeps its device), but builds the
    collapse's matrices: the region over ``build_flops`` collapses (issue 64: TFC's
    WaveEquation2D kept 563 to 916 equations there, 7-10 ms a call against 61-68 us)."""
    code = textwrap.dedent("""
        import dataclasses, json
        import jax, jax.numpy as jnp, numpy as np
        from pejit import pejit
        from pejit._fold import _device
        rng = np.random.default_rng(0)
        C1, C2, C3 = (rng.standard_normal((48, 48)).astype(np.float32) / 7 for _ in range(3))
        X = rng.standard_normal(48).astype(np.float32)
        chain = lambda a, b, c, x: a @ jnp.sin(b) @ (jnp.cos(c) @ x) + 0.5 * x
        a, b, c = (np.float64(m) for m in (C1, C2, C3))
        want = a @ np.sin(b) @ (np.cos(c) @ np.float64(X)) + 0.5 * np.float64(X)
        with jax.default_matmul_precision("highest"), _device.using(dataclasses.replace(_device.CPU, build_flops=0.0)):
            f = pejit(chain, constant_argnums=(0, 1, 2))
            out = f(C1, C2, C3, X)
            spec = f.specialize(C1, C2, C3, X)
            host = _device.host_computes()
        print(json.dumps({"devices": jax.device_count(), "host": host, "err": float(np.max(np.abs(out - want))),
                          "residual": [e.primitive.name for e in spec.residual.jaxpr.eqns],
                          "collapsed": len(spec.residual.report.collapsed)}))
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["devices"] == 2 and not got["host"]
    assert got["residual"] == ["dot_general"] and got["collapsed"] == 1
    assert got["err"] < 1e-4
