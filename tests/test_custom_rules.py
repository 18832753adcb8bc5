"""Known work inside ``custom_vjp``/``custom_jvp`` calls that also take dynamic inputs is folded
(``pejit._residual.rules.custom``), and the user's rules still give the derivatives of the dynamic inputs.

Each case compares values and derivatives with ``jax.jit`` of the same function, and checks
what the residual jaxpr keeps: the custom call stays, the factorization inside it does not.
Rules here are deliberately not the derivative of the primal, so that a derivative JAX
worked out itself (the rule bypassed) would not match.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pejit import FoldOptions, pejit

from ._util import primitive_names

#: What ``inv``/``solve`` of a matrix leave in a jaxpr when they are not folded.
FACTORIZATIONS = {"lu", "getrf", "cholesky", "lu_pivots_to_permutation"}

rng = np.random.default_rng(0)
A = jnp.asarray(rng.standard_normal((5, 5)) / np.sqrt(5) + 3 * np.eye(5), jnp.float32)
X = jnp.asarray(rng.standard_normal(5), jnp.float32)
Y = jnp.asarray(rng.standard_normal(5), jnp.float32)


def residual_names(f, *args, **options) -> list[str]:
    """Primitive names of the residual of ``pejit(f, constant_argnums=0)`` (sub-jaxprs included)."""
    spec = pejit(f, constant_argnums=0, fold_options=FoldOptions(**options)).specialize(*args)
    return primitive_names(spec.residual.jaxpr)


def close(got, want, rtol=1e-5, atol=1e-5):
    jax.tree.map(lambda g, w: np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol),
                 got, want)


def check(f, *args, argnums=1):
    """Values, gradients (w.r.t. ``argnums``, all dynamic) and the residual of ``f`` with args[0] constant."""
    pf = pejit(f, constant_argnums=0)
    close(pf(*args), jax.jit(f)(*args))
    loss = lambda g: lambda *a: jnp.sum(jnp.sin(g(*a)))  # noqa: E731
    close(jax.grad(loss(pf), argnums=argnums)(*args), jax.grad(loss(jax.jit(f)), argnums=argnums)(*args))
    names = residual_names(f, *args)
    assert not FACTORIZATIONS & set(names), names
    return names


# -- custom_vjp ------------------------------------------------------------------------------
@jax.custom_vjp
def inv_apply(a, x):
    return jnp.linalg.inv(a) @ x


def _inv_apply_fwd(a, x):
    return inv_apply(a, x), (a, x)


def _inv_apply_bwd(res, g):  # 3x the true cotangent of x: a rule bypassed would not match
    a, _ = res
    return jnp.zeros_like(a), 3.0 * jnp.linalg.inv(a).T @ g


inv_apply.defvjp(_inv_apply_fwd, _inv_apply_bwd)


def test_the_issues_smallest_case_leaves_no_factorization():
    names = check(inv_apply, A, X)
    assert names.count("custom_vjp_call") == 1
    got = jax.grad(lambda x: pejit(inv_apply, constant_argnums=0)(A, x).sum())(X)
    true = jax.grad(lambda x: (jnp.linalg.inv(A) @ x).sum())(X)
    close(got, 3.0 * true, rtol=1e-4)  # the user's rule, not JAX's derivative


def test_vjp_and_folding_switched_off_agree():
    f = lambda a, x, y: inv_apply(a, x * y)  # noqa: E731
    pf = pejit(f, constant_argnums=0)
    off = pejit(f, constant_argnums=0, fold_options=FoldOptions(calls=False))
    out, vjp = jax.vjp(lambda x, y: pf(A, x, y), X, Y)
    want, vjp_jit = jax.vjp(lambda x, y: jax.jit(f)(A, x, y), X, Y)
    close(out, want)
    close(vjp(Y), vjp_jit(Y))
    close(jax.grad(lambda x: off(A, x, Y).sum())(X), jax.grad(lambda x: pf(A, x, Y).sum())(X))
    assert FACTORIZATIONS & set(residual_names(f, A, X, Y, calls=False))  # nothing folded inside then


def test_pytree_residuals_with_folded_and_forwarded_values():
    @jax.custom_vjp
    def f(a, x):
        return jnp.linalg.inv(a) @ x

    def fwd(a, x):
        ainv = jnp.linalg.inv(a)
        return ainv @ x, {"ainv": ainv, "pair": (a, [x, 2.0 * x])}

    def bwd(res, g):
        ainv, (a, (x, x2)) = res["ainv"], res["pair"]
        return jnp.zeros_like(a), ainv.T @ g + 0.5 * x2 - x  # 0.5 * x2 - x == 0: a pytree round trip

    f.defvjp(fwd, bwd)
    check(f, A, X)


def test_nondiff_argnums():
    @jax.custom_vjp
    def f(fn, a, x):
        return fn(jnp.linalg.inv(a) @ x)

    f = jax.custom_vjp(f.fun, nondiff_argnums=(0,))
    f.defvjp(lambda fn, a, x: (f(fn, a, x), (jnp.linalg.inv(a), x)),
             lambda fn, res, g: (None, 2.0 * res[0].T @ (g * fn(res[0] @ res[1]))))
    g = lambda a, x: f(jnp.cos, a, x)  # noqa: E731
    check(g, A, X)


@pytest.mark.parametrize("argnums", [1, 2, (1, 2)], ids=["x", "y", "both"])
def test_symbolic_zeros(argnums):
    @jax.custom_vjp
    def f(a, x, y):
        return jnp.linalg.inv(a) @ (x * y)

    def fwd(a, x, y):
        assert not a.perturbed  # a constant has no tangent
        a, xv, yv = a.value, x.value, y.value
        # The rule may look at which inputs are perturbed: a different
        # residual for each pattern, the same cotangents.
        res = (jnp.linalg.inv(a), xv, yv, x.perturbed, y.perturbed)
        return jnp.linalg.inv(a) @ (xv * yv), res

    def bwd(res, g):
        ainv, x, y, px, py = res
        ct = ainv.T @ g
        return None, (2.0 * ct * y if px else None), (2.0 * ct * x if py else None)

    f.defvjp(fwd, bwd, symbolic_zeros=True)
    check(f, A, X, Y, argnums=argnums)


def test_equinox_filter_custom_vjp():
    eqx = pytest.importorskip("equinox")

    @eqx.filter_custom_vjp
    def f(vjp_arg, x):
        return jnp.linalg.solve(vjp_arg, x)

    @f.def_fwd
    def f_fwd(perturbed, vjp_arg, x):
        return jnp.linalg.solve(vjp_arg, x), jnp.linalg.inv(vjp_arg)

    @f.def_bwd
    def f_bwd(ainv, g, perturbed, vjp_arg, x):
        return jnp.zeros_like(vjp_arg)  # vjp_arg is the only differentiable input: none for x

    g = lambda a, x: f(a, x) + 0.0 * x  # noqa: E731
    pf = pejit(g, constant_argnums=0)
    close(pf(A, X), jax.jit(g)(A, X))
    assert not FACTORIZATIONS & set(residual_names(g, A, X))

    @eqx.filter_custom_vjp
    def h(vjp_arg, a):  # differentiable in x, a closed-over constant beside it
        x = vjp_arg
        return jnp.linalg.inv(a) @ x

    @h.def_fwd
    def h_fwd(perturbed, vjp_arg, a):
        return jnp.linalg.inv(a) @ vjp_arg, jnp.linalg.inv(a)

    @h.def_bwd
    def h_bwd(ainv, g, perturbed, vjp_arg, a):
        return 4.0 * ainv.T @ g

    check(lambda a, x: h(x, a), A, X)


# -- custom_jvp ------------------------------------------------------------------------------
def test_custom_jvp_with_an_integer_constant():
    @jax.custom_jvp
    def f(n, a, x):
        return jnp.linalg.inv(a) @ x * n

    f.defjvp(lambda p, t: (f(*p), 2.0 * p[0] * jnp.linalg.inv(p[1]) @ t[2]))
    g = lambda c, x: f(c[0], c[1], x)  # noqa: E731
    check(g, (3, A), X)


@jax.custom_jvp
def inv_apply_jvp(a, x):
    return jnp.linalg.inv(a) @ x


@inv_apply_jvp.defjvp
def _inv_apply_jvp_rule(primals, tangents):
    a, x = primals
    return inv_apply_jvp(a, x), 3.0 * jnp.linalg.inv(a) @ tangents[1]


def test_custom_jvp_mixed_inputs():
    names = check(inv_apply_jvp, A, X)
    assert "custom_jvp_call" in names
    pf = pejit(inv_apply_jvp, constant_argnums=0)
    _, t = jax.jvp(lambda x: pf(A, x), (X,), (Y,))
    close(t, 3.0 * jnp.linalg.inv(A) @ Y, rtol=1e-4)
    close(jax.hessian(lambda x: jnp.sum(pf(A, x) ** 3))(X),
          jax.hessian(lambda x: jnp.sum(inv_apply_jvp(A, x) ** 3))(X), rtol=1e-4)


def test_custom_jvp_with_symbolic_zeros():
    @jax.custom_jvp
    def f(a, x, y):
        return jnp.linalg.inv(a) @ (x + y)

    def rule(primals, tangents):
        a, x, y = primals
        ta, tx, ty = tangents
        assert type(ta) is jax.custom_derivatives.SymbolicZero  # a constant has no tangent
        dot = sum(2.0 * t for t in (tx, ty) if type(t) is not jax.custom_derivatives.SymbolicZero)
        return f(a, x, y), jnp.linalg.inv(a) @ dot

    f.defjvp(rule, symbolic_zeros=True)
    for argnums in (1, 2, (1, 2)):
        check(f, A, X, Y, argnums=argnums)


@pytest.mark.parametrize("custom", [inv_apply, inv_apply_jvp], ids=["custom_vjp", "custom_jvp"])
def test_custom_calls_in_loop_bodies(custom):
    def scanned(a, x):
        return lax.scan(lambda c, _: (custom(a, jnp.tanh(c)), None), x, length=3)[0]

    def counted(a, x):  # a scan with a known counter carry, which pejit folds apart
        return lax.fori_loop(0, 3, lambda i, c: custom(a, jnp.tanh(c)), x)

    def looped(a, x):  # a while loop: forward mode only, as under jax.jit
        return lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, custom(a, jnp.tanh(c[1]))), (0, x))[1]

    check(scanned, A, X)
    check(counted, A, X)
    pf = pejit(looped, constant_argnums=0)
    close(pf(A, X), jax.jit(looped)(A, X))
    assert not FACTORIZATIONS & set(residual_names(looped, A, X))
    if custom is inv_apply_jvp:
        _, t = jax.jvp(lambda x: pf(A, x), (X,), (Y,))
        close(t, jax.jvp(lambda x: looped(A, x), (X,), (Y,))[1], rtol=1e-4)


@pytest.mark.parametrize("outer", ["custom_vjp", "custom_jvp"])
def test_nested_custom_calls(outer):
    def inner(a, x):
        return inv_apply_jvp(a, jnp.sin(x)) + inv_apply(a.T, x)

    if outer == "custom_vjp":
        f = jax.custom_vjp(inner)
        f.defvjp(lambda a, x: (f(a, x), (a, x)), lambda r, g: (None, jax.vjp(lambda x: inner(r[0], x), r[1])[1](g)[0]))
    else:
        f = jax.custom_jvp(inner)
        f.defjvp(lambda p, t: (f(*p), jax.jvp(lambda x: inner(p[0], x), (p[1],), (t[1],))[1]))
    names = check(f, A, X)
    assert f"{outer}_call" in names


def test_vmap_and_jit_of_the_folded_call():
    pf = pejit(inv_apply, constant_argnums=0)
    xs = jnp.stack([X, Y, X * Y])
    close(jax.vmap(lambda x: pf(A, x))(xs), jax.vmap(lambda x: inv_apply(A, x))(xs))
    grad = jax.jit(jax.grad(lambda x: pf(A, x).sum()))
    close(grad(X), jax.grad(lambda x: inv_apply(A, x).sum())(X))


# -- custom_linear_solve and custom_root ----------------------------------------------------
def test_solve_with_a_constant_matrix_is_one_product():
    f = lambda a, x: jnp.linalg.solve(a, x)  # noqa: E731  (lax.custom_linear_solve inside)
    names = check(f, A, X)
    assert "custom_linear_solve" not in names and "triangular_solve" not in names
    assert names.count("dot_general") == 1
    kept = residual_names(f, A, X, affine=False)  # residual algebra off: the solve stays
    assert "custom_linear_solve" in kept and "lu" not in kept


def test_solve_of_an_ill_conditioned_matrix_stays_a_solve():
    # cond_1 of a Hilbert-like matrix: far beyond SOLVE_AS_PRODUCT_COND; the product
    # would not agree with jax.jit's solve to its precision (JAX's tensorsolve test)
    H = jnp.asarray(1.0 / (np.arange(5)[:, None] + np.arange(5)[None] + 1), jnp.float32)
    f = lambda a, x: jnp.linalg.solve(a, x)  # noqa: E731
    names = residual_names(f, H, X)
    assert "triangular_solve" in names and "lu" not in names  # the factorization folds, the solve stays
    np.testing.assert_allclose(pejit(f, constant_argnums=0)(H, X), jax.jit(f)(H, X), rtol=1e-6)
    assert residual_names(f, A, X).count("dot_general") == 1  # A is well conditioned: a product


def test_solve_of_a_constant_product_reassociates():
    K = jnp.asarray(rng.standard_normal((5, 5)), jnp.float32)
    f = lambda mk, y: -jnp.linalg.solve(mk[0], mk[1] @ y)  # noqa: E731  (a vector field)
    pf = pejit(f, constant_argnums=0)
    close(pf((A, K), X), jax.jit(f)((A, K), X))
    close(jax.grad(lambda y: pf((A, K), y).sum())(X), jax.grad(lambda y: f((A, K), y).sum())(X))
    names = residual_names(f, (A, K), X)
    assert names.count("dot_general") == 1 and not {"triangular_solve", "custom_linear_solve"} & set(names)


def test_custom_linear_solve_with_a_user_solve():
    def f(a, b):
        matvec = lambda x: a @ x  # noqa: E731
        solve = lambda mv, b: jnp.linalg.inv(a) @ b  # noqa: E731
        transpose_solve = lambda mv, b: jnp.linalg.inv(a).T @ b  # noqa: E731
        return lax.custom_linear_solve(matvec, b, solve, symmetric=False, transpose_solve=transpose_solve)

    names = check(f, A, X)
    assert names.count("dot_general") == 1


def test_custom_root_with_constant_work():
    def f(a, b):
        def fn(x):
            return jnp.linalg.inv(a) @ (x + 0.1 * x ** 3) - b

        def newton(fn, x0):
            return lax.fori_loop(0, 20, lambda i, x: x - jnp.linalg.solve(jax.jacfwd(fn)(x), fn(x)), x0)

        return lax.custom_root(fn, jnp.zeros_like(b), newton, lambda g, y: jnp.linalg.solve(jax.jacfwd(g)(y), y))

    pf = pejit(f, constant_argnums=0)
    close(pf(A, X), jax.jit(f)(A, X), rtol=1e-4)
    close(jax.grad(lambda b: pf(A, b).sum())(X), jax.grad(lambda b: f(A, b).sum())(X), rtol=1e-4)
    if "custom_jvp_call" not in primitive_names(jax.make_jaxpr(f)(A, X).jaxpr):
        pytest.skip("this JAX's lax.custom_root is not a custom_jvp call (0.12: a hi primitive, kept whole)")
    # The Jacobian at each iterate needs an LU; inv(a)'s (in fn, in the Jacobian) folds.
    assert residual_names(f, A, X).count("lu") < residual_names(f, A, X, calls=False).count("lu")


def test_backward_rule_work_on_constant_residuals_folds():
    # _inv_apply_bwd inverts its residual a, a constant: that folds too (the grad program keeps no LU)
    pf = pejit(inv_apply, constant_argnums=0)
    grad = jax.grad(lambda x: jnp.sum(jnp.sin(pf(A, x))))
    close(grad(X), jax.grad(lambda x: jnp.sum(jnp.sin(inv_apply(A, x))))(X))
    assert not FACTORIZATIONS & set(primitive_names(jax.make_jaxpr(grad)(X).jaxpr))
    off = pejit(inv_apply, constant_argnums=0, fold_options=FoldOptions(calls=False))
    assert "lu" in primitive_names(jax.make_jaxpr(jax.grad(lambda x: off(A, x).sum()))(X).jaxpr)


@pytest.mark.parametrize("symbolic", [False, True], ids=["arrays", "symbolic_zeros"])
def test_backward_rule_of_an_output_the_loss_does_not_read(symbolic):
    # The second output's cotangent is zero: JAX 0.12 passes the folded backward
    # rule a symbolic zero there, which its body takes as an array of zeros.
    @jax.custom_vjp
    def f(a, x):
        return jnp.linalg.inv(a) @ x, 2.0 * x

    def fwd(a, x):
        if symbolic:
            a, x = a.value, x.value
        return f(a, x), a

    def bwd(a, cts):
        g, h = cts
        h = 0.0 if type(h) is jax.custom_derivatives.SymbolicZero else h
        return None, 3.0 * jnp.linalg.inv(a).T @ g + 2.0 * h  # 3x: a rule bypassed would not match

    f.defvjp(fwd, bwd, symbolic_zeros=symbolic)
    pf = pejit(f, constant_argnums=0)
    grad = jax.grad(lambda x: jnp.sum(jnp.sin(pf(A, x)[0])))
    close(grad(X), jax.grad(lambda x: jnp.sum(jnp.sin(f(A, x)[0])))(X))
    assert not FACTORIZATIONS & set(primitive_names(jax.make_jaxpr(grad)(X).jaxpr))
