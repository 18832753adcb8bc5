"""Helpers shared by the tests."""

from __future__ import annotations

import functools
import sys
import threading

import jax
import jax.experimental  # enable_x64 before JAX 0.8
import pytest

#: (major, minor) of the JAX under test, for tests of behaviour that changed.
JAX_VERSION = tuple(int(p) for p in jax.__version__.split(".")[:2])


def requires_jax(version: tuple[int, int], why: str):
    """Skip a test on JAX older than ``version``, saying what differs there."""
    return pytest.mark.skipif(JAX_VERSION < version, reason=f"JAX < {'.'.join(map(str, version))}: {why}")


#: For tests of the CPU back end (host rules, the worker thread, NumPy views of
#: jax.Arrays, the cost model's CPU figures). pejit turns that back end on only
#: where JAX computes on one CPU device (``pejit._fold._device.host_computes``): not
#: on an accelerator, nor on several CPU devices
#: (``--xla_force_host_platform_device_count``).
cpu_only = pytest.mark.skipif(
    jax.default_backend() != "cpu" or jax.device_count() != 1, reason="tests the CPU back end"
)


def cpu_devices(why: str):
    """Skip a test unless JAX computes on CPU devices (one or several), saying
    what it needs of them: pejit reads the bytes of values in host memory only
    (``pejit._fold._values.in_host_memory``: equal and uniform constants found by
    their contents), and the cost model has figures for XLA:CPU."""
    return pytest.mark.skipif(jax.default_backend() != "cpu", reason=f"needs CPU devices: {why}")


def f32_products():
    """A context in which JAX multiplies float32 matrices in float32.

    For tests that compare values with a float64 NumPy oracle, or with
    ``jax.jit`` of the same products associated otherwise, within float32's
    tolerances. XLA:CPU multiplies float32 in float32 at any precision; on
    GPUs JAX's default precision multiplies them in TF32 (10 bits of
    mantissa, errors near 1e-3), ``"highest"`` in float32.
    """
    return jax.default_matmul_precision("highest")


def with_f32_products(test):
    """Run ``test`` in :func:`f32_products` (its fixtures and parameters as they are)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        with f32_products():
            return test(*args, **kwargs)
    return run


def all_eqns(jaxpr):
    """Every equation of ``jaxpr``, sub-jaxprs (cond branches, loop bodies, calls) included."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in _subjaxprs(eqn):
            yield from all_eqns(sub)


def _subjaxprs(eqn):
    for v in eqn.params.values():
        for item in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(item, (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)):
                yield item


def primitive_names(jaxpr) -> list[str]:
    return [e.primitive.name for e in all_eqns(jaxpr)]


class Counter:
    """Wraps a function and counts how often Python runs it (i.e. traces)."""

    def __init__(self, fun):
        self.fun = fun
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fun(*args, **kwargs)


class Compiles:
    """Counts XLA compilations (JAX's public monitoring events)."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __enter__(self):
        self.count, self.active = 0, True
        self.where: list[tuple[str | None, str]] = []  # (HLO module, where JAX names it; thread)
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def _listen(self, event, duration, **kwargs):
        if self.active and event == self.EVENT:
            self.count += 1
            self.where.append((kwargs.get("fun_name"), threading.current_thread().name))

    def __exit__(self, *exc):
        self.active = False
        unregister = getattr(jax.monitoring, "unregister_event_duration_listener", None)
        if unregister is not None:  # public from JAX 0.8; before, the listener stays, inactive
            unregister(self._listen)


class Traces(Compiles):
    """Counts ``jax.jit`` traces (JAX's public monitoring events)."""

    EVENT = "/jax/core/compile/jaxpr_trace_duration"


def x64():
    """A context in which JAX computes in 64 bits (``jax.enable_x64``, public since 0.8)."""
    return (jax.enable_x64 if hasattr(jax, "enable_x64") else jax.experimental.enable_x64)(True)


def in_room() -> bool:
    """Whether the caller runs inside pejit's room on the frame stack (pejit._fold._room)."""
    from pejit._fold._room import with_room

    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not with_room.__code__:
        frame = frame.f_back
    return frame is not None
