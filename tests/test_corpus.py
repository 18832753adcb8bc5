"""Differential corpus: pejit agrees with ``jax.jit`` on hundreds of JAX functions.

Every case is a function of two or more array arguments. It runs through
``pejit(f, constant_argnums=...)`` (the call-time form) with two choices of
constant arguments:

* **all**: every argument is constant, so the whole function is folded and
  the residual program only returns folded values;
* **mixed**: the arguments at even positions are constant, the others
  dynamic, so folded values meet staged work.

and the result is compared with ``jax.jit(f)`` on the same arguments: the
same pytree structure, shapes and dtypes, and values

* bit-for-bit for integer, boolean and PRNG-key outputs;
* within ``rtol=RTOL, atol=ATOL * max(1, max|ref|)`` for floating outputs
  (NaNs must match NaNs). Folded values are computed by JAX's eager
  evaluator one primitive at a time, while ``jax.jit`` lets XLA fuse and
  reorder the same primitives, so last-bit differences (a few float32 ulps)
  are expected; see ``docs/numerics.md``.

Cases run in groups of ``GROUP_SIZE`` (one compilation per group, not per
function); the slowest-to-compile functions (``SLOW``) run only with
``PEJIT_FULL_CORPUS=1``. Unary functions ``u`` are tested as ``lambda x, y: (u(x), u(y))`` so that the
mixed choice exists. The module prints how many distinct JAX functions it
covered (see the session summary line ``pejit corpus: ...``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import zlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import jax.scipy as jsp
import jax.scipy.signal  # noqa: F401
import jax.scipy.special as jss
import jax.scipy.stats  # noqa: F401
import numpy as np
import pytest
from jax import lax

from pejit import pejit

from ._util import f32_products

RTOL = 2e-5
ATOL = 2e-6


# -- argument makers ---------------------------------------------------------
def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def F(*shape, lo=-2.0, hi=2.0):
    return lambda r: jnp.asarray(r.uniform(lo, hi, shape), jnp.float32)


def I(*shape, lo=-5, hi=6):
    return lambda r: jnp.asarray(r.integers(lo, hi, shape), jnp.int32)


def U(*shape, hi=8):
    return lambda r: jnp.asarray(r.integers(0, hi, shape), jnp.uint32)


def B(*shape):
    return lambda r: jnp.asarray(r.random(shape) < 0.5)


def C(*shape):
    return lambda r: jnp.asarray(r.normal(size=shape) + 1j * r.normal(size=shape), jnp.complex64)


def SPD(n):
    def make(r):
        a = r.normal(size=(n, n))
        return jnp.asarray(a @ a.T + n * np.eye(n), jnp.float32)

    return make


def KEY(seed=None):
    return lambda r: jax.random.key(int(r.integers(0, 2**31)) if seed is None else seed)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    fun: Callable
    makers: tuple

    def args(self):
        r = _rng(self.name)
        return tuple(m(r) for m in self.makers)


CASES: dict[str, Case] = {}


def attr(module, name):
    """``module.name``, or None where this JAX version lacks (or deprecated) it."""
    try:
        return getattr(module, name)
    except AttributeError:
        return None


def case(name, fun, *makers):
    if fun is None:  # not in this JAX version
        return
    assert name not in CASES, name
    assert len(makers) >= 2, name
    CASES[name] = Case(name, fun, makers)


def unary(name, fun, maker):
    if fun is None:
        return
    case(name, lambda x, y: (fun(x), fun(y)), maker, maker)


# -- jax.numpy: elementwise --------------------------------------------------
S = (3, 4)
for n in ["abs", "absolute", "negative", "positive", "sign", "floor", "ceil", "round", "rint",
          "trunc", "exp", "exp2", "expm1", "sin", "cos", "tan", "arctan", "sinh",
          "cosh", "tanh", "arcsinh", "deg2rad", "rad2deg", "degrees", "radians", "sinc", "i0",
          "signbit", "isfinite", "isinf", "isnan", "isneginf", "isposinf", "square", "cbrt",
          "fabs", "conj", "real", "imag", "nan_to_num", "logical_not", "frexp", "modf",
          "angle", "spacing", "iscomplex", "isreal", "sort_complex"]:
    unary(f"jnp.{n}", attr(jnp, n), F(*S))
for n in ["log", "log2", "log10", "sqrt", "reciprocal"]:
    unary(f"jnp.{n}", attr(jnp, n), F(*S, lo=0.1, hi=4.0))
unary("jnp.log1p", jnp.log1p, F(*S, lo=-0.9, hi=3.0))
for n in ["arcsin", "arccos", "arctanh"]:
    unary(f"jnp.{n}", attr(jnp, n), F(*S, lo=-0.95, hi=0.95))
unary("jnp.arccosh", jnp.arccosh, F(*S, lo=1.0, hi=5.0))
for n in ["invert", "bitwise_not", "bitwise_count"]:
    unary(f"jnp.{n}", attr(jnp, n), I(*S, lo=-100, hi=100))
unary("jnp.abs[complex]", jnp.abs, C(*S))
unary("jnp.exp[complex]", jnp.exp, C(*S))

for n in ["add", "subtract", "multiply", "divide", "true_divide", "maximum", "minimum", "fmax",
          "fmin", "arctan2", "hypot", "copysign", "nextafter", "logaddexp", "logaddexp2",
          "heaviside", "greater", "greater_equal", "less", "less_equal", "equal", "not_equal",
          "isclose", "floor_divide", "mod", "remainder", "fmod", "divmod"]:
    case(f"jnp.{n}", attr(jnp, n), F(*S), F(*S, lo=0.5, hi=3.0))
case("jnp.power", jnp.power, F(*S, lo=0.1, hi=3.0), F(*S))
case("jnp.float_power", jnp.float_power, F(*S, lo=0.1, hi=3.0), F(*S))
for n in ["logical_and", "logical_or", "logical_xor"]:
    case(f"jnp.{n}", attr(jnp, n), B(*S), B(*S))
for n in ["bitwise_and", "bitwise_or", "bitwise_xor", "gcd", "lcm"]:
    case(f"jnp.{n}", attr(jnp, n), I(*S, lo=-50, hi=50), I(*S, lo=1, hi=50))
for n in ["left_shift", "right_shift"]:
    case(f"jnp.{n}", attr(jnp, n), I(*S, lo=-50, hi=50), I(*S, lo=0, hi=8))
case("jnp.ldexp", jnp.ldexp, F(*S), I(*S))
case("jnp.where", jnp.where, B(*S), F(*S), F(*S))
case("jnp.select", lambda c1, c2, x: jnp.select([c1, c2], [x, -x], 7.0), B(*S), B(*S), F(*S))
case("jnp.clip", lambda x, lo, hi: jnp.clip(x, lo, hi), F(*S), F(4, hi=0.0), F(4, lo=0.0))
case("jnp.allclose", lambda x, y: jnp.allclose(x, y, atol=1.0), F(*S), F(*S))
case("jnp.array_equal", jnp.array_equal, I(*S, lo=0, hi=2), I(*S, lo=0, hi=2))
case("jnp.polyval", jnp.polyval, F(4), F(5))
case("jnp.polyadd", jnp.polyadd, F(4), F(3))
case("jnp.polymul", jnp.polymul, F(4), F(3))
case("jnp.polyder", lambda p, q: (jnp.polyder(p), jnp.polyder(q, 2)), F(5), F(4))
case("jnp.polyint", lambda p, q: (jnp.polyint(p), jnp.polyint(q)), F(5), F(4))
case("jnp.interp", jnp.interp, F(6, lo=0, hi=5), lambda r: jnp.arange(6.0), F(6))

# -- jax.numpy: reductions and scans ------------------------------------------
for n in ["sum", "prod", "mean", "std", "var", "max", "min", "amax", "amin", "argmax", "argmin",
          "nansum", "nanmean", "nanmax", "nanmin", "nanstd", "nanvar", "nanprod", "median",
          "nanmedian", "ptp", "cumsum", "cumprod", "nancumsum", "nancumprod", "nanargmax",
          "nanargmin", "count_nonzero", "average"]:
    fn = attr(jnp, n)
    case(f"jnp.{n}", functools.partial(lambda fn, x, y: (fn(x, axis=1), fn(x * y)), fn),
         F(*S), F(*S))
for n in ["all", "any"]:
    case(f"jnp.{n}", functools.partial(lambda fn, x, y: (fn(x, axis=0), fn(x | y)), attr(jnp, n)),
         B(*S), B(*S))
case("jnp.percentile", lambda x, q: jnp.percentile(x, q, axis=1), F(*S), F(2, lo=0, hi=100))
case("jnp.quantile", lambda x, q: jnp.quantile(x, q), F(*S), F(3, lo=0, hi=1))
case("jnp.nanquantile", lambda x, q: jnp.nanquantile(x, q), F(*S), F(3, lo=0, hi=1))
case("jnp.cumulative_sum", lambda x, y: jnp.cumulative_sum(x * y, axis=0, include_initial=True),
     F(*S), F(*S))
case("jnp.cumulative_prod", lambda x, y: jnp.cumulative_prod(x + y, axis=1), F(*S), F(*S))
case("jnp.diff", lambda x, y: (jnp.diff(x), jnp.diff(y, n=2, axis=0)), F(*S), F(*S))
case("jnp.ediff1d", lambda x, y: jnp.ediff1d(x, to_begin=y), F(5), F(2))
case("jnp.trapezoid", lambda y, x: jnp.trapezoid(y, x), F(5), lambda r: jnp.sort(F(5)(r)))
case("jnp.cov", lambda x, y: jnp.cov(x, y), F(5), F(5))
case("jnp.corrcoef", lambda x, y: jnp.corrcoef(x, y), F(5), F(5))
case("jnp.histogram", lambda x, w: jnp.histogram(x, bins=4, range=(-2, 2), weights=w), F(10), F(10))
case("jnp.bincount", lambda x, w: jnp.bincount(x, w, length=6), I(10, lo=0, hi=6), F(10))
case("jnp.digitize", jnp.digitize, F(8), lambda r: jnp.sort(F(4)(r)))

# -- jax.numpy: shapes, indexing, sorting ------------------------------------
A, BB = F(*S), F(*S)
for n, fn in {
    "reshape": lambda x, y: (jnp.reshape(x, (2, 6)), y.reshape(-1)),
    "transpose": lambda x, y: (jnp.transpose(x), y.T),
    "swapaxes": lambda x, y: jnp.swapaxes(x[None] + y[:, None, :1], 0, 2),
    "moveaxis": lambda x, y: jnp.moveaxis(x[None] * y[None], 0, -1),
    "flip": lambda x, y: (jnp.flip(x), jnp.flip(y, 1)),
    "fliplr": lambda x, y: jnp.fliplr(x) - y,
    "flipud": lambda x, y: jnp.flipud(x) - y,
    "rot90": lambda x, y: (jnp.rot90(x), jnp.rot90(y, 3)),
    "roll": lambda x, y: (jnp.roll(x, 2), jnp.roll(y, -1, axis=1)),
    "tile": lambda x, y: jnp.tile(x + y, (2, 1)),
    "repeat": lambda x, y: (jnp.repeat(x, 2, axis=0), jnp.repeat(y, 3)),
    "concatenate": lambda x, y: jnp.concatenate([x, y], axis=1),
    "stack": lambda x, y: jnp.stack([x, y], axis=-1),
    "hstack": lambda x, y: jnp.hstack([x, y]),
    "vstack": lambda x, y: jnp.vstack([x, y]),
    "dstack": lambda x, y: jnp.dstack([x, y]),
    "column_stack": lambda x, y: jnp.column_stack([x[0], y[1]]),
    "split": lambda x, y: jnp.split(x * y, 2, axis=1),
    "array_split": lambda x, y: jnp.array_split(x - y, 3, axis=1),
    "squeeze": lambda x, y: jnp.squeeze(x[None, :, None] + y[:, None]),
    "expand_dims": lambda x, y: (jnp.expand_dims(x, 1), jnp.expand_dims(y, (0, 3))),
    "ravel": lambda x, y: jnp.ravel(x) @ jnp.ravel(y),
    "broadcast_to": lambda x, y: jnp.broadcast_to(x[0], (5, 4)) + y[1],
    "pad": lambda x, y: (jnp.pad(x, ((1, 0), (2, 1))), jnp.pad(y, 1, mode="reflect")),
    "pad[edge]": lambda x, y: jnp.pad(x * y, 2, mode="edge"),
    "diag": lambda x, y: (jnp.diag(x[0]), jnp.diag(y)),
    "diagonal": lambda x, y: jnp.diagonal(x, 1) + jnp.diagonal(y),
    "trace": lambda x, y: jnp.trace(x) * jnp.trace(y, -1),
    "tril": lambda x, y: jnp.tril(x) + jnp.tril(y, -1),
    "triu": lambda x, y: jnp.triu(x, 1) - jnp.triu(y),
    "sort": lambda x, y: (jnp.sort(x), jnp.sort(y, axis=0)),
    "argsort": lambda x, y: (jnp.argsort(x), jnp.argsort(y, axis=0, stable=True)),
    "lexsort": lambda x, y: jnp.lexsort((jnp.round(x[0]), jnp.round(y[0]))),
    "partition": lambda x, y: jnp.partition(x + y, 2),
    "argpartition": lambda x, y: jnp.argpartition(x * y, 1),
    "searchsorted": lambda x, y: jnp.searchsorted(jnp.sort(x.ravel()), y),
    "take": lambda x, y: jnp.take(x, jnp.argmax(y, axis=0), axis=1),
    "take_along_axis": lambda x, y: jnp.take_along_axis(x, jnp.argsort(y, axis=1), axis=1),
    "cross": lambda x, y: jnp.cross(x[:, :3], y[:, :3]),
    "outer": lambda x, y: jnp.outer(x[0], y[1]),
    "inner": lambda x, y: jnp.inner(x, y),
    "dot": lambda x, y: jnp.dot(x, y.T),
    "matmul": lambda x, y: jnp.matmul(x, y.T),
    "vdot": jnp.vdot,
    "tensordot": lambda x, y: jnp.tensordot(x, y, axes=([1], [1])),
    "einsum": lambda x, y: jnp.einsum("ij,kj->ik", x, y),
    "kron": lambda x, y: jnp.kron(x[:2, :2], y[:2]),
    "meshgrid": lambda x, y: jnp.meshgrid(x[0], y[1]),
    "convolve": lambda x, y: jnp.convolve(x[0], y[1]),
    "correlate": lambda x, y: jnp.correlate(x.ravel(), y[0], mode="same"),
    "unique": lambda x, y: jnp.unique(jnp.round(x + y), size=8, fill_value=0),
    "nonzero": lambda x, y: jnp.nonzero(x > y, size=6),
    "argwhere": lambda x, y: jnp.argwhere(x > y, size=6),
    "flatnonzero": lambda x, y: jnp.flatnonzero(x < y, size=5),
    "extract": lambda x, y: jnp.extract(x > y, x, size=5),
    "put_along": lambda x, y: x.at[1, 2].set(y[0, 0]).at[:, 0].add(y[:, 1]),
    "at_mul": lambda x, y: x.at[::2].multiply(y[::2]),
    "at_min_max": lambda x, y: (x.at[0].min(y[1]), x.at[2].max(y[0])),
    "at_get": lambda x, y: x.at[jnp.array([0, 2, 5])].get(mode="fill", fill_value=-1.0) + y[0, 0],
    "fancy_index": lambda x, y: x[jnp.array([2, 0]), 1:] * y[jnp.array([1, 1]), :3],
    "bool_mask_where": lambda x, y: jnp.where(x > 0, x, y).sum(0),
    "atleast_3d": lambda x, y: jnp.atleast_3d(x) * jnp.atleast_2d(y[0])[..., None],
    "append": lambda x, y: jnp.append(x, y, axis=0),
    "insert": lambda x, y: jnp.insert(x, 1, y[0], axis=0),
    "delete": lambda x, y: jnp.delete(x * y, 2, axis=1),
    "resize": lambda x, y: jnp.resize(x + y, (5, 3)),
    "vander": lambda x, y: jnp.vander(x[0] + y[0], 3),
    "tri": lambda x, y: jnp.tri(3, 4) * x + y,
    "eye_identity": lambda x, y: (jnp.eye(3, 4, 1) * x, jnp.identity(4) @ y.T),
    "full_like": lambda x, y: jnp.full_like(x, 2.5) + jnp.zeros_like(y) + jnp.ones_like(x),
    "arange_linspace": lambda x, y: x * jnp.linspace(0, 1, 4) + y * jnp.arange(4.0),
    "logspace_geomspace": lambda x, y: x * jnp.logspace(0, 1, 4) - y * jnp.geomspace(1, 8, 4),
    "apply_along_axis": lambda x, y: jnp.apply_along_axis(lambda v: v.sum() * v.max(), 1, x * y),
    "vectorize": lambda x, y: jnp.vectorize(lambda a, b: a * b + a)(x, y),
    "piecewise": lambda x, y: jnp.piecewise(x, [x < 0, x >= 0], [lambda v: -v, lambda v: v * 2]) + y,
    "fill_diagonal": lambda x, y: jnp.fill_diagonal(x[:3, :3] * y[:3, :3], 0.0, inplace=False),
    "tril_indices": lambda x, y: x[jnp.tril_indices(3)] + y[jnp.triu_indices(3, 1, 4)].sum(),
    "ix_": lambda x, y: x[jnp.ix_(jnp.array([0, 2]), jnp.array([1, 3]))] - y[:2, :2],
    "unravel_ravel_index": lambda x, y: (jnp.unravel_index(jnp.argmax(x), x.shape),
                                         jnp.ravel_multi_index((jnp.array([1, 2]), jnp.array([3, 0])), (3, 4), mode="clip") + jnp.argmin(y)),
    "isin": lambda x, y: jnp.isin(jnp.round(x), jnp.round(y[0])),
    "round_decimals": lambda x, y: jnp.round(x * 10, 1) + jnp.round(y, 2),
    "matrix_transpose": lambda x, y: jnp.matrix_transpose(x[None]) @ y,
    "einsum_path3": lambda x, y: jnp.einsum("ij,kj,kl->il", x, y, y),
    "blockdiag_block": lambda x, y: jnp.block([[x, y], [y, x]]),
    "copy_astype": lambda x, y: (jnp.copy(x).astype(jnp.int32), y.astype(jnp.float16)),
}.items():
    case(f"jnp.{n}", fn, A, BB)

# -- jax.numpy.linalg and fft -------------------------------------------------
SQ = F(4, 4)
for n, fn, ms in [
    ("inv", lambda a, b: jnp.linalg.inv(a) @ b, (SPD(4), F(4, 2))),
    ("det", lambda a, b: jnp.linalg.det(a) * b, (SQ, F(2))),
    ("slogdet", lambda a, b: jnp.linalg.slogdet(a + b), (SQ, SQ)),
    ("solve", jnp.linalg.solve, (SPD(4), F(4, 3))),
    ("cholesky", lambda a, b: jnp.linalg.cholesky(a) @ b, (SPD(4), F(4, 2))),
    ("qr", lambda a, b: jnp.linalg.qr(a @ b), (F(5, 4), SQ)),
    ("svd", lambda a, b: jnp.linalg.svd(a * b, compute_uv=False), (SQ, SQ)),
    ("eigh", lambda a, b: jnp.linalg.eigh(a)[0] + b, (SPD(4), F(4))),
    ("eigvalsh", lambda a, b: jnp.linalg.eigvalsh(a) * b, (SPD(4), F(4))),
    ("eigvals", lambda a, b: jnp.sort_complex(jnp.linalg.eigvals(a)) * b, (SPD(4), F(4))),
    ("norm", lambda a, b: (jnp.linalg.norm(a), jnp.linalg.norm(b, ord=1, axis=1),
                           jnp.linalg.norm(a, ord="nuc")), (SQ, SQ)),
    ("pinv", lambda a, b: jnp.linalg.pinv(a) @ b, (F(5, 3), F(5))),
    ("matrix_power", lambda a, b: jnp.linalg.matrix_power(a * 0.5, 3) + b, (SQ, SQ)),
    ("matrix_rank", lambda a, b: jnp.linalg.matrix_rank(a @ b), (F(4, 2), F(2, 4))),
    ("lstsq", lambda a, b: jnp.linalg.lstsq(a, b)[0], (F(6, 3), F(6))),
    ("multi_dot", lambda a, b: jnp.linalg.multi_dot([a, b, a]), (SQ, SQ)),
    ("cond", lambda a, b: jnp.linalg.cond(a) * b, (SPD(4), F(2))),
    ("tensorsolve", lambda a, b: jnp.linalg.tensorsolve(a, b), (SPD(4), F(4))),
    ("vector_norm", lambda a, b: jnp.linalg.vector_norm(a - b, axis=0), (SQ, SQ)),
    ("matrix_norm", lambda a, b: jnp.linalg.matrix_norm(a @ b, ord="fro"), (SQ, SQ)),
    ("svdvals", lambda a, b: jnp.linalg.svdvals(a + b), (SQ, SQ)),
    ("vecdot", lambda a, b: jnp.linalg.vecdot(a, b), (SQ, SQ)),
]:
    case(f"jnp.linalg.{n}", fn, *ms)
for n, fn, ms in [
    ("fft", lambda x, y: jnp.fft.fft(x + 1j * y), (F(8), F(8))),
    ("ifft", lambda x, y: jnp.fft.ifft(x * y), (F(8), F(8))),
    ("rfft", lambda x, y: jnp.fft.rfft(x) * y[:5], (F(8), F(8))),
    ("irfft", lambda x, y: jnp.fft.irfft(jnp.fft.rfft(x) * y[:5]), (F(8), F(8))),
    ("fft2", lambda x, y: jnp.fft.fft2(x - y), (F(4, 4), F(4, 4))),
    ("fftn", lambda x, y: jnp.fft.ifftn(jnp.fft.fftn(x) * y), (F(4, 4), F(4, 4))),
    ("rfftn", lambda x, y: jnp.fft.irfftn(jnp.fft.rfftn(x + y), s=(4, 4)), (F(4, 4), F(4, 4))),
    ("fftshift", lambda x, y: (jnp.fft.fftshift(x), jnp.fft.ifftshift(y)), (F(6), F(7))),
    ("fftfreq", lambda x, y: x * jnp.fft.fftfreq(8) + y * jnp.fft.rfftfreq(8)[:1], (F(8), F(1))),
    ("hfft", lambda x, y: jnp.fft.hfft(x + 1j * y), (F(5), F(5))),
]:
    case(f"jnp.fft.{n}", fn, *ms)

# -- jax.lax --------------------------------------------------------------------
for n in ["exp", "sin", "cos", "tan", "tanh", "logistic", "erf", "erfc", "atan", "sinh", "cosh",
          "asinh", "expm1", "neg", "sign", "floor", "ceil", "is_finite", "square", "cbrt",
          "exp2", "abs"]:
    unary(f"lax.{n}", attr(lax, n), F(*S))
for n in ["log", "sqrt", "rsqrt", "lgamma", "digamma", "bessel_i0e", "bessel_i1e"]:
    unary(f"lax.{n}", attr(lax, n), F(*S, lo=0.2, hi=4.0))
for n in ["erf_inv", "asin", "acos", "atanh"]:
    unary(f"lax.{n}", attr(lax, n), F(*S, lo=-0.9, hi=0.9))
unary("lax.log1p", lax.log1p, F(*S, lo=-0.5, hi=3))
unary("lax.acosh", lax.acosh, F(*S, lo=1.1, hi=3))
unary("lax.round", lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN), F(*S))
unary("lax.population_count", lax.population_count, I(*S, lo=-99, hi=99))
unary("lax.clz", lax.clz, I(*S, lo=-99, hi=99))
unary("lax.not", lax.bitwise_not, I(*S, lo=-99, hi=99))
unary("lax.integer_pow", lambda x: lax.integer_pow(x, 3), F(*S))
unary("lax.reduce_precision", lambda x: lax.reduce_precision(x, 5, 10), F(*S))
unary("lax.bitcast_convert_type", lambda x: lax.bitcast_convert_type(x, jnp.int32), F(*S))
unary("lax.convert_element_type", lambda x: lax.convert_element_type(x, jnp.int8), F(*S, lo=-9, hi=9))
for n in ["add", "sub", "mul", "div", "rem", "max", "min", "atan2", "nextafter", "pow", "eq",
          "ne", "lt", "le", "gt", "ge"]:
    case(f"lax.{n}", attr(lax, n), F(*S, lo=0.5, hi=2), F(*S, lo=0.5, hi=2))
for n in ["igamma", "igammac", "random_gamma_grad", "polygamma", "zeta"]:
    case(f"lax.{n}", attr(lax, n), F(*S, lo=1.0, hi=3), F(*S, lo=1.5, hi=3))
for n in ["shift_left", "shift_right_logical", "shift_right_arithmetic", "bitwise_and",
          "bitwise_or", "bitwise_xor"]:
    case(f"lax.{n}", attr(lax, n), I(*S, lo=-99, hi=99), I(*S, lo=0, hi=7))
case("lax.betainc", lax.betainc, F(*S, lo=0.5, hi=3), F(*S, lo=0.5, hi=3), F(*S, lo=0.05, hi=0.95))
case("lax.clamp", lax.clamp, lambda r: jnp.float32(-0.5), F(*S), lambda r: jnp.float32(0.7))
case("lax.select_n", lambda p, a, b: lax.select_n(p, a, b), B(*S), F(*S), F(*S))
case("lax.complex", lambda a, b: lax.real(lax.complex(a, b)) + lax.imag(lax.complex(b, a)) + lax.conj(lax.complex(a, b)).imag, F(*S), F(*S))
case("lax.dot_general", lambda a, b: lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,)))), F(2, 3, 4), F(2, 4, 5))
case("lax.dot", lambda a, b: lax.dot(a, b, precision=lax.Precision.HIGHEST), F(3, 4), F(4, 2))
case("lax.batch_matmul", lax.batch_matmul, F(2, 3, 4), F(2, 4, 5))
case("lax.conv_general_dilated", lambda x, k: lax.conv_general_dilated(
    x, k, (1, 1), "SAME", rhs_dilation=(1, 2), dimension_numbers=("NHWC", "HWIO", "NHWC")),
     F(1, 6, 6, 2), F(3, 3, 2, 3))
case("lax.conv", lambda x, k: lax.conv(x, k, (2, 1), "VALID"), F(1, 2, 7, 6), F(3, 2, 3, 3))
case("lax.conv_with_general_padding", lambda x, k: lax.conv_with_general_padding(
    x, k, (1, 1), ((1, 2), (0, 1)), (2, 1), (1, 1)), F(1, 1, 5, 5), F(2, 1, 2, 2))
case("lax.conv_transpose", lambda x, k: lax.conv_transpose(
    x, k, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")), F(1, 4, 4, 2), F(3, 3, 2, 1))
case("lax.conv_grouped", lambda x, k: lax.conv_general_dilated(
    x, k, (1,), [(1, 1)], feature_group_count=2), F(1, 4, 8), F(4, 2, 3))
case("lax.reduce_window", lambda x, y: lax.reduce_window(x * y, -jnp.inf, lax.max, (2, 2), (1, 2), "SAME"),
     F(4, 6), F(4, 6))
case("lax.reduce_window_sum", lambda x, y: lax.reduce_window(x, 0.0, lax.add, (2, 3), (1, 1), "VALID") + y,
     F(4, 6), F(3, 4))
case("lax.reduce", lambda x, y: lax.reduce((x, y), (0.0, 1.0), lambda a, b: (a[0] + b[0], a[1] * b[1]), (0,)),
     F(*S), F(*S))
for n in ["reduce_sum", "reduce_max", "reduce_min", "reduce_prod"]:
    case(f"lax.{n}", functools.partial(lambda fn, x, y: fn(x * y, (1,)), attr(lax, n)), F(*S), F(*S))
case("lax.reduce_and_or", lambda x, y: (lax.reduce_and(x, (0,)), lax.reduce_or(y, (1,)), lax.reduce_xor(x, (1,))),
     B(*S), B(*S))
case("lax.argmax_argmin", lambda x, y: (lax.argmax(x, 1, jnp.int32), lax.argmin(y, 0, jnp.int32)), F(*S), F(*S))
for n in ["cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"]:
    case(f"lax.{n}", functools.partial(lambda fn, x, y: (fn(x, 1), fn(y, 0, reverse=True)), attr(lax, n)),
         F(*S), F(*S))
case("lax.sort", lambda x, y: lax.sort((x, y), dimension=1, num_keys=1), F(*S), F(*S))
case("lax.sort_key_val", lambda x, y: lax.sort_key_val(x, y, 0), F(*S), I(*S))
case("lax.top_k", lambda x, y: lax.top_k(x + y, 2), F(*S), F(*S))
case("lax.approx_max_k", lambda x, y: lax.approx_max_k(x * y, 2), F(*S), F(*S))
case("lax.gather", lambda x, i: lax.gather(
    x, i, lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,)),
    (1, 4), mode=lax.GatherScatterMode.CLIP), F(*S), I(5, 1, lo=0, hi=3))
SDN = lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(0,),
                                  scatter_dims_to_operand_dims=(0,))
for n in ["scatter", "scatter_add", "scatter_mul", "scatter_min", "scatter_max", "scatter_sub"]:
    case(f"lax.{n}", functools.partial(
        lambda fn, x, i, u: fn(x, i, u, SDN, mode=lax.GatherScatterMode.FILL_OR_DROP), attr(lax, n)),
         F(*S), I(2, 1, lo=0, hi=3), F(2, 4))
case("lax.scatter_apply", lambda x, i: x.at[i].apply(jnp.sin), F(6), I(2, lo=0, hi=6))
case("lax.dynamic_slice", lambda x, i: lax.dynamic_slice(x, (i, i + 1), (2, 2)), F(*S), lambda r: jnp.int32(1))
case("lax.dynamic_update_slice", lambda x, u, i: lax.dynamic_update_slice(x, u, (i, 0)),
     F(*S), F(2, 4), lambda r: jnp.int32(1))
case("lax.dynamic_index_in_dim", lambda x, i: lax.dynamic_index_in_dim(x, i, 1, keepdims=False),
     F(*S), lambda r: jnp.int32(2))
case("lax.dynamic_slice_in_dim", lambda x, i: lax.dynamic_slice_in_dim(x, i, 2, 0), F(*S), lambda r: jnp.int32(5))
case("lax.dynamic_update_index_in_dim", lambda x, u, i: lax.dynamic_update_index_in_dim(x, u, i, 0),
     F(*S), F(4), lambda r: jnp.int32(2))
case("lax.slice", lambda x, y: (lax.slice(x, (0, 1), (3, 4), (2, 2)), lax.slice_in_dim(y, 1, 3, axis=1),
                                lax.index_in_dim(x, 2, 0)), F(*S), F(*S))
case("lax.pad", lambda x, p: lax.pad(x, p, ((1, -1, 1), (0, 2, 0))), F(*S), lambda r: jnp.float32(9.0))
case("lax.concatenate", lambda x, y: lax.concatenate([x, y, x], 0), F(*S), F(*S))
case("lax.broadcast_in_dim", lambda x, y: lax.broadcast_in_dim(x, (2, 3, 4), (1, 2)) * y, F(*S), F(2, 1, 1))
case("lax.broadcast", lambda x, y: lax.broadcast(x, (2,)) + y, F(*S), F(*S))
case("lax.reshape", lambda x, y: lax.reshape(x, (4, 3), dimensions=(1, 0)) + y, F(*S), F(4, 3))
case("lax.rev", lambda x, y: lax.rev(x, (0, 1)) - y, F(*S), F(*S))
case("lax.transpose", lambda x, y: lax.transpose(x[None] + y[:, None], (2, 0, 1)), F(*S), F(*S))
case("lax.squeeze_expand", lambda x, y: lax.squeeze(lax.expand_dims(x, (0,)), (0,)) * y, F(*S), F(*S))
case("lax.iota", lambda x, y: lax.iota(jnp.float32, 4) * x + lax.broadcasted_iota(jnp.int32, S, 0) * y, F(*S), F(*S))
case("lax.stop_gradient", lambda x, y: lax.stop_gradient(x) * y, F(*S), F(*S))
case("lax.optimization_barrier", lambda x, y: lax.optimization_barrier((x, y)), F(*S), F(*S))
case("lax.collapse", lambda x, y: lax.collapse(x[None] * y, 0, 2), F(*S), F(*S))
case("lax.full", lambda x, y: lax.full((3, 4), 2.0) * x + lax.full_like(y, 1.0), F(*S), F(*S))
# control flow
case("lax.cond", lambda p, x: lax.cond(p, jnp.sin, jnp.cos, x), lambda r: jnp.bool_(True), F(*S))
case("lax.cond[false]", lambda p, x: lax.cond(p > 0, lambda v: v * 2, lambda v: v - 1, x),
     lambda r: jnp.float32(-1.0), F(*S))
case("lax.switch", lambda i, x: lax.switch(i, [jnp.sin, jnp.cos, jnp.tanh], x), lambda r: jnp.int32(7), F(*S))
case("lax.while_loop", lambda n, x: lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 1.1 + 1.0),
                                                   (0, x))[1], lambda r: jnp.int32(5), F(*S))
case("lax.fori_loop", lambda x, y: lax.fori_loop(0, 4, lambda i, c: c * y + i, x), F(*S), F(*S))
case("lax.fori_loop[dynamic_trip]", lambda n, x: lax.fori_loop(0, n, lambda i, c: jnp.sin(c) + i, x),
     lambda r: jnp.int32(3), F(*S))
case("lax.scan", lambda x, ys: lax.scan(lambda c, y: (c * 0.9 + y, c.sum()), x, ys), F(4), F(5, 4))
case("lax.scan[reverse_unroll]", lambda x, ys: lax.scan(lambda c, y: (jnp.tanh(c + y), c), x, ys,
                                                        reverse=True, unroll=2), F(4), F(5, 4))
case("lax.map", lambda xs, w: lax.map(lambda x: x @ w, xs), F(3, 4), F(4, 2))
case("lax.associative_scan", lambda x, y: lax.associative_scan(jnp.add, x * y, axis=1), F(*S), F(*S))
case("jax.vmap", lambda x, y: jax.vmap(jnp.outer)(x, y), F(*S), F(*S))
case("jax.grad", lambda x, y: jax.grad(lambda a: jnp.sum(jnp.sin(a) * y))(x), F(*S), F(*S))
case("jax.jvp", lambda x, y: jax.jvp(jnp.tanh, (x,), (y,)), F(*S), F(*S))
case("jax.checkpoint", lambda x, y: jax.checkpoint(lambda a: jnp.sin(a) * y)(x), F(*S), F(*S))
case("jax.jit[nested]", lambda x, y: jax.jit(lambda a, b: a @ b.T)(x, y), F(*S), F(*S))
case("jax.custom_jvp", lambda x, y: jax.nn.relu(x) + jax.numpy.logaddexp(x, y), F(*S), F(*S))

# -- jax.scipy ------------------------------------------------------------------
for n in ["erf", "erfc", "expit", "gammaln", "gamma", "digamma", "i0", "i0e", "i1", "i1e",
          "ndtr", "log_ndtr", "entr", "factorial", "spence", "expi", "exp1", "sinc" if hasattr(jss, "sinc") else "erf"]:
    if f"jss.{n}" not in CASES:
        unary(f"jss.{n}", attr(jss, n), F(*S, lo=0.2, hi=3.0))
for n in ["erfinv", "logit", "ndtri"]:
    unary(f"jss.{n}", attr(jss, n), F(*S, lo=0.05, hi=0.95))
for n in ["xlogy", "xlog1py", "betaln", "gammainc", "gammaincc", "rel_entr", "kl_div", "poch", "zeta"]:
    case(f"jss.{n}", attr(jss, n), F(*S, lo=1.1, hi=3.0), F(*S, lo=0.2, hi=3.0))
case("jss.polygamma", jss.polygamma, I(*S, lo=0, hi=3), F(*S, lo=0.5, hi=3))
case("jss.betainc", jss.betainc, F(*S, lo=0.5, hi=3), F(*S, lo=0.5, hi=3), F(*S, lo=0.05, hi=0.95))
case("jss.logsumexp", lambda x, b: jss.logsumexp(x, axis=1, b=b), F(*S), F(*S, lo=0.1, hi=1))
case("jss.softmax", lambda x, y: (jss.softmax(x), jss.log_softmax(y, axis=0)), F(*S), F(*S))
case("jss.multigammaln", lambda x, y: jss.multigammaln(x + 2.0, 2) + y, F(*S, lo=0.5, hi=2), F(*S))
case("jss.expn", lambda x, y: jss.expn(2, x) + y, F(*S, lo=0.2, hi=2), F(*S))
case("jss.hyp1f1", jss.hyp1f1, F(*S, lo=0.2, hi=1), F(*S, lo=1.0, hi=2), F(*S, lo=0.1, hi=1))
case("jss.bessel_jn", lambda x, y: jss.bessel_jn(x + y, v=2, n_iter=20), F(*S, lo=0.5, hi=2), F(*S, lo=0, hi=1))
case("jss.gammasgn_lgamma", lambda x, y: (jss.gammasgn(x), jss.loggamma(y)), F(*S, lo=-3, hi=3), F(*S, lo=0.5, hi=3))
case("jss.sph_harm_y", lambda t, p: jss.sph_harm_y(jnp.array([2]), jnp.array([1]), t, p, n_max=3),
     F(3, lo=0.1, hi=3), F(3, lo=0.1, hi=3))
case("jss.fresnel_like_erf_sum", lambda x, y: jss.erf(x) + jss.erfc(y) * jss.ndtr(x - y), F(*S), F(*S))
for n, fn, ms in [
    ("cho_solve", lambda a, b: jsp.linalg.cho_solve(jsp.linalg.cho_factor(a), b), (SPD(4), F(4, 2))),
    ("lu", lambda a, b: jsp.linalg.lu(a @ b), (SQ, SPD(4))),
    ("lu_solve", lambda a, b: jsp.linalg.lu_solve(jsp.linalg.lu_factor(a), b), (SPD(4), F(4))),
    ("solve_triangular", lambda a, b: jsp.linalg.solve_triangular(a, b, lower=True), (SPD(4), F(4, 2))),
    ("expm", lambda a, b: jsp.linalg.expm(a * 0.3) @ b, (SQ, F(4))),
    ("block_diag", lambda a, b: jsp.linalg.block_diag(a, b), (F(2, 2), F(3, 1))),
    ("toeplitz", lambda a, b: jsp.linalg.toeplitz(a, b), (F(4), F(3))),
    ("det", lambda a, b: jsp.linalg.det(a - b), (SQ, SQ)),
    ("inv", lambda a, b: jsp.linalg.inv(a) + b, (SPD(4), SQ)),
    ("eigh", lambda a, b: jsp.linalg.eigh(a, eigvals_only=True) * b, (SPD(4), F(4))),
    ("qr", lambda a, b: jsp.linalg.qr(a + b, mode="r"), (SQ, SQ)),
    ("svd", lambda a, b: jsp.linalg.svd(a @ b, compute_uv=False), (SQ, SQ)),
    ("schur", lambda a, b: jnp.diag(jsp.linalg.schur(a)[0]) * b, (SPD(4), F(4))),
    ("hessenberg", lambda a, b: jnp.abs(jsp.linalg.hessenberg(a)) + b, (SPD(4), F(4, 4))),
    ("polar", lambda a, b: jsp.linalg.polar(a)[1] + b, (SPD(4), SQ)),
    ("cholesky", lambda a, b: jsp.linalg.cholesky(a, lower=True) * b, (SPD(4), SQ)),
    ("solve", lambda a, b: jsp.linalg.solve(a, b, assume_a="pos"), (SPD(4), F(4))),
    ("circulant", lambda a, b: jsp.linalg.circulant(a) @ b if hasattr(jsp.linalg, "circulant") else a + b, (F(4), F(4))),
]:
    case(f"jsp.linalg.{n}", fn, *ms)
for n, fn, ms in [
    ("convolve", lambda x, k: jsp.signal.convolve(x, k, mode="same"), (F(10), F(3))),
    ("correlate", lambda x, k: jsp.signal.correlate(x, k), (F(10), F(3))),
    ("convolve2d", lambda x, k: jsp.signal.convolve2d(x, k, mode="valid"), (F(5, 5), F(2, 3))),
    ("correlate2d", lambda x, k: jsp.signal.correlate2d(x, k, mode="full"), (F(4, 4), F(2, 2))),
    ("fftconvolve", lambda x, k: jsp.signal.fftconvolve(x, k), (F(8), F(4))),
    ("detrend", lambda x, y: (jsp.signal.detrend(x), jsp.signal.detrend(y, type="constant")), (F(8), F(8))),
    ("stft", lambda x, y: jnp.abs(jsp.signal.stft(x * y, nperseg=8)[2]), (F(32), F(32))),
    ("welch", lambda x, y: jsp.signal.welch(x + y, nperseg=8)[1], (F(32), F(32))),
    ("csd", lambda x, y: jnp.abs(jsp.signal.csd(x, y, nperseg=8)[1]), (F(32), F(32))),
]:
    case(f"jsp.signal.{n}", fn, *ms)
stats = jsp.stats
for n, fn, ms in [
    ("norm", lambda x, m: (stats.norm.pdf(x, m), stats.norm.logcdf(x, m), stats.norm.ppf(jnp.abs(jnp.tanh(x)) * 0.9 + 0.05)), (F(*S), F(*S))),
    ("t", lambda x, d: stats.t.logpdf(x, d + 1.0), (F(*S), F(*S, lo=0.5, hi=3))),
    ("gamma", lambda x, a: stats.gamma.logpdf(x, a), (F(*S, lo=0.1, hi=3), F(*S, lo=0.5, hi=3))),
    ("beta", lambda x, a: stats.beta.logpdf(x, a, 2.0), (F(*S, lo=0.05, hi=0.95), F(*S, lo=0.5, hi=3))),
    ("poisson", lambda k, m: stats.poisson.logpmf(k, m), (I(*S, lo=0, hi=5), F(*S, lo=0.5, hi=3))),
    ("multivariate_normal", lambda x, m: stats.multivariate_normal.logpdf(x, m, jnp.eye(4)), (F(3, 4), F(4))),
    ("laplace_logistic", lambda x, s: (stats.laplace.cdf(x, scale=s), stats.logistic.logpdf(x, scale=s)),
     (F(*S), F(*S, lo=0.5, hi=2))),
    ("expon_cauchy", lambda x, s: (stats.expon.logpdf(x, scale=s), stats.cauchy.logpdf(x, scale=s)),
     (F(*S, lo=0.1, hi=2), F(*S, lo=0.5, hi=2))),
    ("bernoulli_binom", lambda k, p: (stats.bernoulli.logpmf(k % 2, p), stats.binom.logpmf(k, 5, p)),
     (I(*S, lo=0, hi=5), F(*S, lo=0.1, hi=0.9))),
    ("dirichlet", lambda x, a: stats.dirichlet.logpdf(x / x.sum(), a), (F(4, lo=0.1, hi=1), F(4, lo=0.5, hi=2))),
    ("gennorm_chi2", lambda x, b: (stats.gennorm.logpdf(x, b), stats.chi2.logpdf(jnp.abs(x) + 0.1, b)),
     (F(*S), F(*S, lo=1, hi=3))),
]:
    case(f"jsp.stats.{n}", fn, *ms)

# -- jax.nn ---------------------------------------------------------------------
for n in ["relu", "relu6", "sigmoid", "softplus", "soft_sign", "silu", "swish", "gelu", "elu",
          "celu", "selu", "leaky_relu", "hard_tanh", "hard_sigmoid", "hard_silu", "log_sigmoid",
          "log_softmax", "softmax", "standardize", "sparse_plus", "squareplus", "mish",
          "logsumexp", "sparse_sigmoid", "tanh"]:
    unary(f"jax.nn.{n}", attr(jax.nn, n), F(*S, lo=-4, hi=4))
case("jax.nn.glu", lambda x, y: jax.nn.glu(x * y), F(*S), F(*S))
case("jax.nn.gelu[exact]", lambda x, y: jax.nn.gelu(x, approximate=False) * y, F(*S), F(*S))
case("jax.nn.one_hot", lambda i, x: jax.nn.one_hot(i, 4) * x, I(3, lo=0, hi=4), F(3, 1))
case("jax.nn.dot_product_attention", jax.nn.dot_product_attention, F(1, 3, 2, 4), F(1, 5, 2, 4), F(1, 5, 2, 4))
case("jax.nn.initializers", lambda k, x: jax.nn.initializers.glorot_normal()(k, (4, 3)) * x
     + jax.nn.initializers.he_uniform()(k, (4, 3)), KEY(), F(4, 3))

# -- jax.random (typed keys) ------------------------------------------------------
R = {
    "normal": lambda k: jax.random.normal(k, S),
    "uniform": lambda k: jax.random.uniform(k, S, minval=-1.0, maxval=3.0),
    "randint": lambda k: jax.random.randint(k, S, -4, 9),
    "bernoulli": lambda k: jax.random.bernoulli(k, 0.3, S),
    "categorical": lambda k: jax.random.categorical(k, jnp.log(jnp.arange(1.0, 5.0)), shape=(6,)),
    "permutation": lambda k: jax.random.permutation(k, 8),
    "choice": lambda k: jax.random.choice(k, 10, (4,), replace=False),
    "gamma": lambda k: jax.random.gamma(k, 2.0, S),
    "beta": lambda k: jax.random.beta(k, 2.0, 3.0, S),
    "dirichlet": lambda k: jax.random.dirichlet(k, jnp.ones(3), (2,)),
    "exponential": lambda k: jax.random.exponential(k, S),
    "laplace": lambda k: jax.random.laplace(k, S),
    "logistic": lambda k: jax.random.logistic(k, S),
    "cauchy": lambda k: jax.random.cauchy(k, S),
    "poisson": lambda k: jax.random.poisson(k, 3.0, S),
    "truncated_normal": lambda k: jax.random.truncated_normal(k, -1.0, 2.0, S),
    "multivariate_normal": lambda k: jax.random.multivariate_normal(k, jnp.zeros(2), jnp.eye(2), (3,)),
    "split": lambda k: jax.random.key_data(jax.random.split(k, 3)),
    "fold_in": lambda k: jax.random.normal(jax.random.fold_in(k, 7), (2,)),
    "bits": lambda k: jax.random.bits(k, S),
    "gumbel": lambda k: jax.random.gumbel(k, S),
    "rademacher": lambda k: jax.random.rademacher(k, S),
    "maxwell": lambda k: jax.random.maxwell(k, S),
    "t": lambda k: jax.random.t(k, 3.0, S),
    "chisquare": lambda k: jax.random.chisquare(k, 2.0, S),
    "weibull_min": lambda k: jax.random.weibull_min(k, 1.0, 1.5, S),
    "orthogonal": lambda k: jax.random.orthogonal(k, 3),
    "ball": lambda k: jax.random.ball(k, 3, shape=(2,)),
    "loggamma": lambda k: jax.random.loggamma(k, 2.0, S),
    "geometric": lambda k: jax.random.geometric(k, 0.3, S),
    "binomial": lambda k: jax.random.binomial(k, 5.0, 0.4, S),
    "pareto": lambda k: jax.random.pareto(k, 2.0, S),
    "rayleigh": lambda k: jax.random.rayleigh(k, 1.0, S),
    "wald": lambda k: jax.random.wald(k, 1.0, S),
    "triangular": lambda k: jax.random.triangular(k, 0.0, 0.5, 1.0, S),
    "lognormal": lambda k: jax.random.lognormal(k, 0.5, S),
    "generalized_normal": lambda k: jax.random.generalized_normal(k, 1.5, S),
    "double_sided_maxwell": lambda k: jax.random.double_sided_maxwell(k, 0.0, 1.0, S),
    "f": lambda k: jax.random.f(k, 2.0, 3.0, S),
    "key_roundtrip": lambda k: jax.random.key_data(jax.random.wrap_key_data(jax.random.key_data(k))),
}
for n, draw in R.items():
    case(f"jax.random.{n}", functools.partial(lambda draw, k, x: (draw(k), x), draw), KEY(), F(2))
case("jax.random.key_as_output", lambda k, x: (jax.random.split(k)[1], x * 2), KEY(), F(2))
case("jax.random.split_then_normal", lambda k, x: x * jax.random.normal(jax.random.split(k, 2)[1], (2,)),
     KEY(), F(2))


# -- the harness --------------------------------------------------------------------
def _np(leaf):
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(leaf))
    return np.asarray(leaf)


def assert_same(got, want, where=""):
    """Same pytree, shapes, dtypes; exact ints/bools/keys, RTOL/ATOL floats."""
    got_leaves, got_tree = jax.tree_util.tree_flatten_with_path(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten_with_path(want)
    assert got_tree == want_tree, f"{where}: pytree {got_tree} != {want_tree}"
    for (path, g), (_, w) in zip(got_leaves, want_leaves):
        at = f"{where} at {jax.tree_util.keystr(path)}"
        g, w = jnp.asarray(g), jnp.asarray(w)
        assert g.shape == w.shape, f"{at}: shape {g.shape} != {w.shape}"
        assert g.dtype == w.dtype, f"{at}: dtype {g.dtype} != {w.dtype}"
        gn, wn = _np(g), _np(w)
        if jnp.issubdtype(w.dtype, jnp.inexact):
            finite = np.abs(wn[np.isfinite(wn)])
            scale = max(1.0, float(finite.max(initial=0.0)))
            np.testing.assert_allclose(gn, wn, rtol=RTOL, atol=ATOL * scale, equal_nan=True, err_msg=at)
        else:
            np.testing.assert_array_equal(gn, wn, err_msg=at)


def available(c: Case) -> bool:
    """Whether this JAX version has everything ``c`` calls (tracing only), and
    ``jax.jit`` lowers it for this backend (XLA:CPU lowers every case; on a GPU
    ``jsp.linalg.hessenberg``, for one, has no lowering)."""
    try:
        jax.eval_shape(c.fun, *c.args())
    except AttributeError:
        return False
    if jax.default_backend() != "cpu":
        try:
            jax.jit(c.fun).lower(*c.args())
        except NotImplementedError:
            return False
    return True


#: Cases run in groups: one function returning ``{name: case(...)}`` over the
#: concatenated arguments of its cases, so that each group costs one
#: ``jax.jit`` compilation and one pejit specialization per constant choice
#: instead of one per case (compilation dominates the run time).
GROUP_SIZE = 12

#: Functions whose compilation is slow (series, continued fractions,
#: rejection-sampling loops, spectral windows): a few seconds each. They run
#: when PEJIT_FULL_CORPUS=1; CI runs the rest (still >= 300 functions).
SLOW = {
    *(f"jax.random.{n}" for n in [
        "gamma", "beta", "dirichlet", "loggamma", "chisquare", "t", "f", "poisson", "binomial",
        "generalized_normal", "ball", "orthogonal", "maxwell", "double_sided_maxwell", "wald",
        "multivariate_normal", "truncated_normal", "geometric"]),
    *(f"jss.{n}" for n in [
        "gammainc", "gammaincc", "betainc", "expi", "exp1", "expn", "spence", "sph_harm_y", "hyp1f1",
        "bessel_jn", "zeta", "polygamma", "poch", "multigammaln", "i0", "i0e", "i1", "i1e", "ndtri",
        "erfinv", "digamma", "gammasgn_lgamma", "betaln", "factorial", "gamma", "kl_div"]),
    *(f"lax.{n}" for n in [
        "igamma", "igammac", "random_gamma_grad", "polygamma", "zeta", "betainc", "bessel_i0e",
        "bessel_i1e", "digamma", "lgamma", "erf_inv"]),
    *(n for n in CASES if n.startswith("jsp.stats.")),
    "jsp.signal.stft", "jsp.signal.welch", "jsp.signal.csd", "jnp.i0", "jax.nn.initializers",
}
NAMES = sorted(n for n in CASES if os.environ.get("PEJIT_FULL_CORPUS") or n not in SLOW)
GROUPS = [NAMES[i:i + GROUP_SIZE] for i in range(0, len(NAMES), GROUP_SIZE)]


def grouped(cases: list[Case]):
    sizes = [len(c.makers) for c in cases]
    offsets = np.cumsum([0, *sizes])

    def fun(*args):
        return {c.name: c.fun(*args[o:o + n]) for c, o, n in zip(cases, offsets, sizes)}

    args = tuple(a for c in cases for a in c.args())
    choices = {
        "all": tuple(range(len(args))),
        "mixed": tuple(int(o) + i for o, n in zip(offsets, sizes) for i in range(0, n, 2)),
    }
    return fun, args, choices


_covered: set[str] = set()


@pytest.fixture(scope="module", autouse=True)
def _coverage_summary(request):
    yield
    line = (f"pejit corpus: {len(_covered)} distinct JAX functions agree with jax.jit "
            f"({len(NAMES)} selected of {len(CASES)}; PEJIT_FULL_CORPUS=1 selects all)")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line(line)


@pytest.mark.parametrize("group", GROUPS, ids=[f"{g[0]}..{g[-1]}" for g in GROUPS])
def test_corpus(group):
    cases = [CASES[n] for n in group if available(CASES[n])]
    if not cases:
        pytest.skip("none of these functions exists in this JAX version")
    fun, args, choices = grouped(cases)
    with f32_products():  # else, on GPUs, TF32 products: jax.jit's and pejit's round apart
        want = jax.jit(fun)(*args)
        for choice, nums in choices.items():
            got = pejit(fun, constant_argnums=nums)(*args)
            assert_same(got, want, f"[{choice} constant]")
            # the TFC form, its constants jax.Arrays: its look traces jax.jit closed over them
            held = [jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
            got = pejit(*held, constant_arg_nums=list(nums))(fun)(*(a for i, a in enumerate(held) if i not in nums))
            assert_same(got, want, f"[{choice} constant, TFC form]")
    _covered.update(c.name for c in cases)


def test_corpus_size():
    assert len(NAMES) >= 300
