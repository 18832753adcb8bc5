"""The programs the suite measures, written once for every variant.

Importable in the TFC worker too, so pejit and TFC fold the same code.
"""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp


# -- case 1: linsolve ---------------------------------------------------------
def linsolve(A, x):
    """``inv(A) @ x + cholesky(A @ A.T) @ x``: all the heavy work is on ``A``."""
    return jnp.linalg.inv(A) @ x + jnp.linalg.cholesky(A @ A.T) @ x


def linsolve_folded(Ainv, L, x):
    """The same with the constant work done by hand."""
    return Ainv @ x + L @ x


def linsolve_data(n: int = 1000, seed: int = 0):
    rng = np.random.default_rng(seed)
    A = (rng.standard_normal((n, n)) / np.sqrt(n) + 2 * np.eye(n)).astype(np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    return A, x


# -- case 2: basis (TFC-style least-squares residual) -------------------------
def chebyshev(x, degree: int):
    """Chebyshev basis ``H(x)`` and its first two derivatives, by recurrence.

    One small operation per degree and derivative: the kind of code TFC
    users write, which ``jax.jit`` recomputes on every call.
    """
    T = [jnp.ones_like(x), x]
    dT = [jnp.zeros_like(x), jnp.ones_like(x)]
    d2T = [jnp.zeros_like(x), jnp.zeros_like(x)]
    for _ in range(2, degree):
        T.append(2 * x * T[-1] - T[-2])
        dT.append(2 * T[-2] + 2 * x * dT[-1] - dT[-2])
        d2T.append(4 * dT[-2] + 2 * x * d2T[-1] - d2T[-2])
    return jnp.stack(T, 1), jnp.stack(dT, 1), jnp.stack(d2T, 1)


def basis_residual(x, xi, degree: int = 64):
    """Residual of ``y'' + y = f`` on collocation points ``x`` for coefficients ``xi``."""
    H, _, H2 = chebyshev(x, degree)
    rhs = jnp.exp(-x) * jnp.cos(3 * x)
    return (H2 + H) @ xi - rhs


def basis_residual_folded(K, rhs, xi):
    return K @ xi - rhs


def basis_data(points: int = 4096, degree: int = 64):
    x = np.cos(np.pi * (np.arange(points) + 0.5) / points).astype(np.float32)
    xi = np.random.default_rng(1).standard_normal(degree).astype(np.float32) / degree
    return x, xi


def basis_fold_by_hand(x, degree: int = 64):
    H, _, H2 = chebyshev(jnp.asarray(x), degree)
    return jax.block_until_ready((H2 + H, jnp.exp(-x) * jnp.cos(3 * x)))


# -- case 3: PLN (seed 003), plain Adam ---------------------------------------
def log_stirling(integer):
    integer_ = integer + (integer == 0)
    return jnp.log(jnp.sqrt(2 * jnp.pi * integer_)) + integer_ * jnp.log(integer_ / jnp.exp(1))


def pln_neg_elbo(params, Omega, Y, O, X):
    """The tutorial's ``get_ELBO`` (negated ELBO), data as arguments."""
    return pln_neg_elbo_folded(params, Omega, Y, O, X, jnp.sum(log_stirling(Y)))


def pln_neg_elbo_folded(params, Omega, Y, O, X, stirling):
    """The same with ``sum(log_stirling(Y))`` precomputed by hand."""
    B, M, S = params
    n, p = Y.shape
    S2 = jnp.square(S)
    XB = X @ B
    A = jnp.exp(O + M + XB + S2 / 2)
    # The tutorial's log(det(Omega)) overflows float32 (det > 3e38) within
    # about 50 iterations on these data; slogdet is the same quantity, stably.
    elbo = n / 2 * jnp.linalg.slogdet(Omega)[1]
    elbo += jnp.sum(-A + Y * (O + M + XB) + 0.5 * jnp.log(S2))
    elbo -= 0.5 * jnp.trace(M.T @ M + jnp.diag(jnp.sum(S2, axis=0)) @ Omega)
    elbo += 0.5 * n * p - stirling
    return -elbo


LR, B1, B2, EPS = 1e-2, 0.9, 0.999, 1e-8


def _adam_update(loss_grad, state, Y, O, X, *extra):
    """One step: value and gradient, Adam on (B, M, S), closed-form Sigma/Omega."""
    params, Omega, m, v, t = state
    loss, grads = loss_grad(params, Omega, Y, O, X, *extra)
    t = t + 1
    m = jax.tree.map(lambda a, g: B1 * a + (1 - B1) * g, m, grads)
    v = jax.tree.map(lambda a, g: B2 * a + (1 - B2) * g * g, v, grads)
    mhat = jax.tree.map(lambda a: a / (1 - B1**t), m)
    vhat = jax.tree.map(lambda a: a / (1 - B2**t), v)
    params = jax.tree.map(lambda p_, a, b: p_ - LR * a / (jnp.sqrt(b) + EPS), params, mhat, vhat)
    B, M, S = params
    n = Y.shape[0]
    Sigma = (M.T @ M + jnp.diag(jnp.sum(S**2, axis=0))) / n
    return (params, jnp.linalg.inv(Sigma), m, v, t), loss


def pln_step(state, Y, O, X):
    return _adam_update(jax.value_and_grad(pln_neg_elbo), state, Y, O, X)


def pln_step_folded(state, Y, O, X, stirling):
    return _adam_update(jax.value_and_grad(pln_neg_elbo_folded), state, Y, O, X, stirling)


def pln_fit(state, Y, O, X, iterations: int):
    """The tutorial's level 2: the whole fit as one ``lax.scan``."""
    state, elbo = jax.lax.scan(lambda s, _: pln_step(s, Y, O, X), state, None, length=iterations)
    return elbo


def pln_fit_folded(state, Y, O, X, stirling, iterations: int):
    step = lambda s, _: pln_step_folded(s, Y, O, X, stirling)  # noqa: E731
    return jax.lax.scan(step, state, None, length=iterations)[1]


def pln_data(n: int = 11600, p: int = 114, seed: int = 3):
    """Synthetic counts shaped like the oaks data (116 samples x 100 repeats)."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(0.0, 1.0, size=p)
    offsets = np.log(rng.integers(100, 2000, size=(n, 1))).astype(np.float32)
    Y = rng.poisson(np.exp(np.clip(mu + rng.normal(0, 1, size=(n, p)), -5, 5))).astype(np.float32)
    O = np.repeat(offsets, p, axis=1) - np.log(1000.0).astype(np.float32)
    X = np.ones((n, 1), np.float32)
    return Y, O.astype(np.float32), X


def pln_init(Y, X):
    n, p = Y.shape
    d = X.shape[1]
    params = (jnp.zeros((d, p)), jnp.zeros((n, p)), jnp.ones((n, p)))
    zeros = jax.tree.map(jnp.zeros_like, params)
    return (params, jnp.eye(p), zeros, zeros, jnp.zeros((), jnp.int32))


# -- case 4: fold time ---------------------------------------------------------
def chain(K: int):
    """``K`` elementwise operations on a constant, then one dynamic add."""
    ops = (jnp.sin, lambda a: a * 1.0001, lambda a: a + 0.5, jnp.cos)

    def known(A):
        a = A
        for k in range(K):
            a = ops[k % 4](a)
        return a

    def f(A, x):
        return known(A) + x

    return f, known


def sin_chain(K: int):
    """Issue 48's chain, as its users write it: ``K`` steps of ``sin(c) * 1.001 + 0.5``
    on a constant, then a product with the dynamic ``x``."""

    def known(A):
        c = A
        for _ in range(K):
            c = jnp.sin(c) * 1.001 + 0.5
        return c

    def f(A, x):
        return known(A) @ x

    return f, known


# -- case 5: compile time and memory vs folded size ----------------------------
def cos_matvec(A, x):
    return jnp.cos(A) @ x


# -- case 6: dispatch ----------------------------------------------------------
def tiny(c, x):
    return c * x + 1.0


# -- case 7: automatic constants ------------------------------------------------
def ridge_loss(params, X, y, lam: float = 0.1):
    """A preconditioned least-squares loss: ``cholesky(X.T @ X + lam I)`` depends on ``X`` only."""
    L = jnp.linalg.cholesky(X.T @ X + lam * jnp.eye(X.shape[1], dtype=X.dtype))
    z = jax.scipy.linalg.solve_triangular(L, X.T @ (X @ params - y), lower=True)
    return jnp.sum(z**2)


def plain_loss(params, X, y):
    """Nothing depends on ``X`` or ``y`` alone: folding removes nothing."""
    return jnp.sum(jnp.tanh(X @ params - y) ** 2)


def ridge_data(n: int = 2000, p: int = 500, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = (rng.standard_normal((n, p)) / np.sqrt(n)).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    return X, y
