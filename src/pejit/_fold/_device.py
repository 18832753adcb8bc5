"""The device the fold decides for: a profile of its relative costs.

Several of the fold's decisions weigh costs that differ from one device to
another, and each reads them here rather than asking which platform it is on:

* whether the *host* computes folded values (NumPy rules, the worker thread's
  kernels: :mod:`pejit._fold._host`, :mod:`pejit._fold._offload`). On a CPU
  the host's arrays are the device's, so that is free; elsewhere every value
  would cross to the device;
* how the affine collapse builds its matrices (:mod:`pejit._residual._collapse`):
  by ``jax.jvp`` compiled for the device, up to ``build_flops``, whose
  compile grows with the region; or by the host's BLAS, nothing compiled, up
  to ``host_build_flops``: on an accelerator its constants cross to the host
  and the (small) matrices back, which a region worth collapsing repays;
* how much a compiled batch saves over op-by-op evaluation (``bandwidth``,
  ``cached_bytes``: :func:`pejit._fold._plan.plan_batch`).

The host computes folded values only on one CPU device: with several (as
``--xla_force_host_platform_device_count`` makes them), an eager result keeps
its input's device, which a NumPy result would not; the host still builds
the collapse's matrices there, whose constants are the program's own.

Tests check what the fold decides for another device by setting its profile
on the CPU (:func:`using`), so a regression that only an accelerator would
show fails on every machine.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools

import jax


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """What the fold's decisions take a device to cost (see the module docstring).

    Attributes:
      platform: JAX's name of the platform (``"cpu"``, ``"gpu"``, ``"tpu"``).
      host_is_device: the host's arrays are the device's (a CPU): the host may
        compute folded values, where there is one device.
      bandwidth: bytes per second of writing and re-reading an intermediate,
        which fusing a batch's run into one program saves.
      cached_bytes: intermediates up to this size stay in a core's cache
        between two kernels: fusing saves nothing on them.
      build_flops: the most FLOPs building a collapse's matrix by ``jax.jvp``,
        compiled, may take.
      host_build_flops: the same for the host's build (NumPy, nothing compiled).
      flops_per_second, bytes_per_second, kernel_seconds: what a call spends per
        FLOP, per byte read from memory and per kernel run on its own, which
        :meth:`pejit._fold._cost.Cost.seconds` weighs.
    """

    platform: str
    host_is_device: bool
    bandwidth: float
    cached_bytes: int
    build_flops: float
    host_build_flops: float
    flops_per_second: float = 1e9
    bytes_per_second: float = 1e9
    kernel_seconds: float = 5e-6


#: A CPU: host memory traffic is slow (an eager elementwise op on large
#: arrays is bound by it), intermediates up to ``cached_bytes`` stay in cache,
#: a region's ``jax.jvp`` compiles for seconds past ``build_flops`` of build,
#: while the host's NumPy builds a region tens of times larger in about a
#: second. Per call, a FLOP of elementwise work costs about as much as a byte
#: read, and a kernel of its own (a product, a LAPACK call) a few microseconds
#: to launch: as much again as a small matrix-vector product takes to compute.
CPU = DeviceProfile("cpu", host_is_device=True, bandwidth=2e9, cached_bytes=2**20, build_flops=8e9,
                    host_build_flops=1e12)
#: An accelerator: device memory is fast (fusing saves little), the host is
#: across a link. The host's build is the CPU's, its inputs copied over. Per
#: call, the CPU's weights of FLOPs, bytes and kernels against each other (no
#: accelerator's own are calibrated here).
GPU = DeviceProfile("gpu", host_is_device=False, bandwidth=5e11, cached_bytes=0, build_flops=8e9,
                    host_build_flops=1e12, flops_per_second=1e12, bytes_per_second=1e12, kernel_seconds=5e-9)
TPU = dataclasses.replace(GPU, platform="tpu")

PROFILES = {p.platform: p for p in (CPU, GPU, TPU)}

_override: contextvars.ContextVar[DeviceProfile | None] = contextvars.ContextVar("pejit_device", default=None)


def current() -> DeviceProfile:
    """The profile of the device JAX computes on (``jax.default_backend()``), or the one
    :func:`using` sets."""
    return _override.get() or PROFILES.get(jax.default_backend(), GPU)


def host_computes() -> bool:
    """Whether the host computes folded values: the device is a CPU, the only one."""
    return current().host_is_device and _device_count() == 1


@functools.cache
def _device_count() -> int:
    return jax.device_count()


@contextlib.contextmanager
def using(profile: DeviceProfile):
    """Decide for ``profile``'s device while in this context (for tests on another device).

    Example:
      >>> from pejit._fold import _device
      >>> with _device.using(_device.GPU):
      ...     _device.host_computes()
      False
    """
    token = _override.set(profile)
    try:
        yield profile
    finally:
        _override.reset(token)


__all__ = ["CPU", "GPU", "PROFILES", "TPU", "DeviceProfile", "current", "host_computes", "using"]
