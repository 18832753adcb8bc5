"""The fold does not care how a program spells a zero, a one or an identity (issue 48).

TFC's examples write their boundary terms as ``H(np.zeros_like(x), ...)``
with ``np`` being ``jax.numpy``: a broadcast of a literal, made anew at each
use; the bench's formulation builds one NumPy array outside. Each spelling
must reach the same folds: the known work on a zero (a basis evaluated at
it, its derivatives) recorded once, the same residual program, the same
values.
"""

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pejit import pejit
from pejit._fold import _host

from ._util import cpu_devices, cpu_only

#: pejit finds equal known inputs (a zero however spelled) by their bytes, which
#: it reads only in host memory: on an accelerator each zero is its own input.
same_inputs = cpu_devices("equal known inputs are found by their bytes in host memory")

N, M = 40, 24  # 160-byte coordinates: not evaluated on the spot (pejit._fold._folding.TINY_BYTES)
W = np.linspace(-1, 1, M, dtype=np.float32).reshape(1, M)
Z0, O0 = np.zeros(N, np.float32), np.ones(N, np.float32)


def basis(z, y):
    """An expensive known function of a coordinate (lax's ``tanh``: one primitive the batches count)."""
    z, y = jnp.asarray(z), jnp.asarray(y)
    return lax.tanh(z[:, None] * W + y[:, None] * 0.5 - 0.25)


#: a zero of ``y``'s shape and type (``y`` is a constant in [1, 2])
ZEROS = {
    "numpy outside": lambda y: Z0,
    "numpy inside": lambda y: np.zeros_like(y),
    "zeros_like": jnp.zeros_like,
    "zeros": lambda y: jnp.zeros(y.shape, y.dtype),
    "full_like": lambda y: jnp.full_like(y, 0.0),
    "broadcast_to": lambda y: jnp.broadcast_to(np.float32(0), y.shape),
    "times zero": lambda y: y * 0,
    "jax.Array": lambda y: jax.device_put(Z0),
}

#: a one of ``y``'s shape and type
ONES = {
    "numpy outside": lambda y: O0,
    "numpy inside": lambda y: np.ones_like(y),
    "ones_like": jnp.ones_like,
    "full_like": lambda y: jnp.full_like(y, 1.0),
    "broadcast_to": lambda y: jnp.broadcast_to(np.float32(1), y.shape),
    "jax.Array": lambda y: jax.device_put(O0),
}


def program(zero, one):
    """A TFC-like constrained expression: the basis at the zero and at the one, again and again
    (each term, and ``jacfwd``'s derivatives of each term, evaluate it anew)."""

    def f(xi, x, y):
        def u(xi, x):
            return (basis(x, y) @ xi - (1 - x) * (basis(zero(y), y) @ xi)
                    - x * (basis(one(y), y) @ xi))

        du = jax.jacfwd(lambda x: u(xi, x))(x)
        return u(xi, x) + jnp.diag(du) + basis(zero(y), y).sum(1) + jax.jacfwd(u)(xi, one(y)).sum(1)

    return f


x = np.linspace(0, 1, N, dtype=np.float32)
y = np.linspace(1, 2, N, dtype=np.float32)
xi = np.linspace(-1, 1, M, dtype=np.float32) / M


def fold(zero, one):
    f = program(zero, one)
    g = pejit(xi, x, y, constant_arg_nums=[1, 2])(f)
    report = g.report(xi)
    evaluated = sum((b.primitives for b in report.batches), collections.Counter())
    return g(xi), report, evaluated, f


@pytest.fixture(scope="module")
def reference():
    return fold(ZEROS["zeros_like"], ONES["ones_like"])


def prims(jaxpr) -> list[str]:
    return [e.primitive.name for e in jaxpr.eqns]


#: Spellings ``jax.jit`` cannot trace (NumPy's ``zeros_like`` of a traced array): the TFC
#: form traces their Python with the values instead of replaying ``jax.jit``'s trace, which
#: evaluates the basis once more (4 times against 3) and orders the residual's constants its own way
PYTHON_TRACED = {"numpy inside"}


def _same_fold(got, reference, again: int = 0):
    """``got`` folds as ``reference`` does, the basis evaluated ``again`` more times (and the
    residual's constants then in another order)."""
    out, report, evaluated, f = got
    ref_out, ref_report, ref_evaluated, _ = reference
    expected = jax.jit(lambda xi: f(xi, x, y))(xi)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-5, atol=1e-5)
    if jax.default_backend() != "cpu":
        return  # each spelling's zeros are inputs of their own (see same_inputs): right values, other folds
    # the basis is evaluated as often (once per distinct input), and so is the rest of the known work
    assert evaluated["tanh"] == ref_evaluated["tanh"] + again, (evaluated, ref_evaluated)
    assert evaluated["dot_general"] == ref_evaluated["dot_general"]
    assert report.residual_eqns == ref_report.residual_eqns
    if again:
        assert prims(report.after.jaxpr) == prims(ref_report.after.jaxpr)
    else:
        assert str(report.after.jaxpr) == str(ref_report.after.jaxpr)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref_out))


@same_inputs
def test_the_reference_folds_the_basis_at_the_zero_once(reference):
    """The zero is used six times and the one five times, the basis at each once."""
    _, report, evaluated, _ = reference
    plain = fold(lambda y: Z0, lambda y: O0)[2]  # the same NumPy arrays each time: the same inputs
    assert evaluated["tanh"] == plain["tanh"], (evaluated, plain)
    assert report.residual_eqns > 0


@pytest.mark.parametrize("spelling", ZEROS)
def test_every_zero_folds_alike(spelling, reference):
    _same_fold(fold(ZEROS[spelling], ONES["ones_like"]), reference, spelling in PYTHON_TRACED)


@pytest.mark.parametrize("spelling", ONES)
def test_every_one_folds_alike(spelling, reference):
    _same_fold(fold(ZEROS["zeros_like"], ONES[spelling]), reference, spelling in PYTHON_TRACED)


def test_a_zero_with_signs_is_not_the_zero(reference):
    """``y * 0`` with negative ``y`` holds ``-0.0`` there: not bit for bit a zero, folded on its own."""
    neg = -y
    out, _, evaluated, f = fold(lambda y: neg * 0, ONES["ones_like"])
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(lambda xi: f(xi, x, y))(xi)), rtol=1e-5,
                               atol=1e-5)
    assert evaluated["tanh"] >= reference[2]["tanh"]


IDENTITIES = {
    "numpy eye": lambda n: np.eye(n, dtype=np.float32),
    "jnp.eye": lambda n: jnp.eye(n, dtype=np.float32),
    "jnp.identity": lambda n: jnp.identity(n, dtype=np.float32),
    "jax.Array": lambda n: jax.device_put(np.eye(n, dtype=np.float32)),
    "diag of ones": lambda n: jnp.diag(jnp.ones(n, np.float32)),
}


def identity_products(eye, monkeypatch) -> list[bool]:
    """Whether each product that the fold tried as a product with an identity was one (``_host.times_identity``)."""
    hits = []
    times_identity = _host.times_identity

    def counting(*args, **kwargs):
        out = times_identity(*args, **kwargs)
        hits.append(out is not None)
        return out

    monkeypatch.setattr(_host, "times_identity", counting)

    def f(xi, y):
        return (basis(y, y) @ eye(M)) @ xi + (eye(N) @ basis(y, y)) @ xi

    g = pejit(xi, y, constant_arg_nums=[1])(f)
    g.specialize(xi)  # the fold, waited for where it runs beside the first calls
    out = g(xi)
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(lambda xi: f(xi, y))(xi)), rtol=1e-6)
    monkeypatch.undo()
    return hits


@cpu_only  # the host rule for a product with an identity
@pytest.mark.parametrize("spelling", IDENTITIES)
def test_every_identity_is_an_identity(spelling, monkeypatch):
    """A product with an identity matrix however built only moves the other operand: both
    products of the program, as with NumPy's ``eye``."""
    hits = identity_products(IDENTITIES[spelling], monkeypatch)
    assert hits == identity_products(IDENTITIES["numpy eye"], monkeypatch)
    assert sum(hits) >= 2, hits


def test_a_call_whose_body_is_spelled_anew_folds_once():
    """JAX's transformations give a call a body of its own each time (TFC's
    ``jnp.multiply`` of its basis, in a derivative and in the function):
    equal bodies on equal inputs are one fold, and one constant of the residual."""
    c = np.linspace(0, 1, N * M, dtype=np.float32).reshape(N, M)

    def f(xi, c):
        first = jax.jit(lambda a: lax.tanh(a) * 2.0)(c)
        anew = jax.jit(lambda a: lax.tanh(a) * 2.0)(c)  # another function, the same body
        other = jax.jit(lambda a: lax.tanh(a) * 3.0)(c)  # another body
        return first @ xi + anew @ xi - other @ xi

    g = pejit(xi, c, constant_arg_nums=[1])(f)
    report = g.report(xi)
    evaluated = sum((b.primitives for b in report.batches), collections.Counter())
    assert evaluated["jit"] == 2, evaluated  # the calls, evaluated whole
    np.testing.assert_allclose(np.asarray(g(xi)), np.asarray(jax.jit(f)(xi, c)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["tfc", "call"])
def test_a_product_with_a_negative_zero_is_not_the_product_with_zero(form):
    """The fold memo keys a scalar by its bits: ``c * -0.0`` holds ``-0.0`` where ``c * 0.0`` holds ``0.0``."""
    def f(x, c):
        return x + 1 / lax.mul(c, 0.0), x + 1 / lax.mul(c, -0.0)

    one = np.float32(1)
    g = pejit(one, y, constant_arg_nums=[1])(f) if form == "tfc" else functools.partial(
        pejit(f, constant_argnums=1), c=y)
    for got, want in zip(g(one), jax.jit(f)(one, y)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
