"""Case 16: what users differentiate: gradient and training steps through
diffrax, optimistix, Equinox and Optax, per step against the hand-folded step and ``jax.jit``.

Each gradient is taken in both orders: ``pejit`` of a function that calls
``jax.grad`` (the step folded whole), and ``jax.grad`` of a pejit function
(pejit's derivative, ``pejit._calls._derivatives``), under ``jax.jit``. The
hand-folded step computes the constant work once by hand (``solve(M, K)``,
``inv(B)``, the features of a frozen network) and runs the rest under
``jax.jit``. Figures are medians of rounds in which a variant and the
hand-folded step run back to back, the order alternating (``side_by_side``);
ratios are paired by round.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pejit import pejit

from ._common import paired

ORDERS = ("pejit of the step", "jax.grad of pejit")


def _mesh(n: int):
    eye = lambda k: np.eye(n, k=k, dtype=np.float32)  # noqa: E731
    return jnp.asarray((4 * eye(0) + eye(1) + eye(-1)) / 6), jnp.asarray((2 * eye(0) - eye(1) - eye(-1)) * 0.1)


def _check(fns: dict[str, Callable[[], Any]], ref: str, rtol: float) -> float:
    """The largest difference of each variant from ``ref`` relative to ``ref``'s largest entry; raise over ``rtol``."""
    want = [np.asarray(x, np.float64) for x in jax.tree.leaves(fns[ref]())]
    worst = 0.0
    for name, fn in fns.items():
        for got, w in zip(jax.tree.leaves(fn()), want):
            err = float(np.max(np.abs(np.asarray(got, np.float64) - w)) / (np.max(np.abs(w)) or 1.0))
            if err > rtol:
                raise AssertionError(f"{name} differs from {ref} by {err:.2e}")
            worst = max(worst, err)
    return worst


def _orders(f: Callable, consts: tuple, x, hand: Callable, folded: Any, closed: bool = True) -> dict:
    """The gradient of ``sum(f(*consts, x))`` w.r.t. ``x``: ``jax.jit`` (constants closed
    over, as users write it), pejit in both orders, and by hand (``hand(folded, x)``)."""
    nums = tuple(range(len(consts)))
    loss = lambda g: lambda *a: jnp.sum(g(*a))  # noqa: E731
    step = jax.grad(loss(f), argnums=len(consts))
    jitted = jax.jit(lambda x: step(*consts, x)) if closed else jax.jit(step)
    folded_step = pejit(step, constant_argnums=nums)
    pf = pejit(f, constant_argnums=nums)
    grad_of_pejit = jax.jit(jax.grad(lambda x: loss(pf)(*consts, x)))
    by_hand = jax.jit(jax.grad(loss(hand), argnums=1))
    return {"jax.jit": (lambda: jitted(x)) if closed else (lambda: jitted(*consts, x)),
            ORDERS[0]: lambda: folded_step(*consts, x), ORDERS[1]: lambda: grad_of_pejit(x),
            "hand-folded": lambda: by_hand(folded, x)}


def diffrax_gradient(nonlinear: bool) -> tuple[dict, float]:
    """A user's diffrax program, its gradient w.r.t. ``y0``; ``nonlinear`` adds
    ``0.1 sin(y)`` to the field (the user's is linear: its gradient does not
    depend on ``y0``, and pejit of the step folds it to a constant)."""
    import diffrax

    n = 200
    M = jnp.eye(n) * 2 + 0.01  # the user's constants
    K = jnp.eye(n) + 0.001
    extra = (lambda y: 0.1 * jnp.sin(y)) if nonlinear else (lambda y: 0.0)

    def ode(M, K, y0):
        term = diffrax.ODETerm(lambda t, y, a: -jnp.linalg.solve(a[0], a[1] @ y) + extra(y))
        return diffrax.diffeqsolve(term, diffrax.Tsit5(), 0., 1., 0.05, y0, args=(M, K)).ys

    def hand(MK, y0):
        term = diffrax.ODETerm(lambda t, y, a: -(a @ y) + extra(y))
        return diffrax.diffeqsolve(term, diffrax.Tsit5(), 0., 1., 0.05, y0, args=MK).ys

    fns = _orders(ode, (M, K), jnp.ones(n), hand, jnp.linalg.solve(M, K))
    return fns, _check(fns, "jax.jit", 1e-4)


def equinox_gradient() -> tuple[dict, float]:
    """An Equinox ``filter_custom_vjp`` function of a constant 300x300 matrix: ``inv(A) @ x``
    in its primal and in its backward rule."""
    import equinox as eqx

    n = 300
    rng = np.random.default_rng(0)
    A = jnp.asarray(rng.standard_normal((n, n)).astype(np.float32) / np.sqrt(n) + 3 * np.eye(n, dtype=np.float32))

    @eqx.filter_custom_vjp
    def inv_apply(vjp_arg, a):
        return jnp.linalg.inv(a) @ vjp_arg

    @inv_apply.def_fwd
    def fwd(perturbed, vjp_arg, a):
        return inv_apply(vjp_arg, a), None

    @inv_apply.def_bwd
    def bwd(res, g, perturbed, vjp_arg, a):
        return jnp.linalg.inv(a).T @ g

    f = lambda A, x: jnp.tanh(inv_apply(x, A))  # noqa: E731
    hand = lambda Ainv, x: jnp.tanh(Ainv @ x)  # noqa: E731
    fns = _orders(f, (A,), jnp.asarray(rng.standard_normal(n).astype(np.float32)), hand, jnp.linalg.inv(A),
                  closed=False)
    return fns, _check(fns, "jax.jit", 1e-4)


def optimistix_gradient() -> tuple[dict, float]:
    """An optimistix Newton root find whose residual function applies ``inv(B)``, ``B`` a
    constant 200x200 matrix, differentiated w.r.t. its right-hand side (implicitly)."""
    import optimistix as optx

    n = 200
    rng = np.random.default_rng(1)
    B = jnp.asarray(rng.standard_normal((n, n)).astype(np.float32) / np.sqrt(n) + 3 * np.eye(n, dtype=np.float32))
    solver = optx.Newton(rtol=1e-5, atol=1e-5)

    def root(B, b):
        fn = lambda y, b: jnp.linalg.inv(B) @ (y + 0.1 * y ** 3) - b  # noqa: E731
        return optx.root_find(fn, solver, jnp.zeros(n), args=b, max_steps=32).value

    def hand(Binv, b):
        fn = lambda y, b: Binv @ (y + 0.1 * y ** 3) - b  # noqa: E731
        return optx.root_find(fn, solver, jnp.zeros(n), args=b, max_steps=32).value

    fns = _orders(root, (B,), jnp.asarray(rng.standard_normal(n).astype(np.float32)), hand, jnp.linalg.inv(B),
                  closed=False)
    return fns, _check(fns, "jax.jit", 1e-3)


def training_loop(quick: bool) -> tuple[dict, float]:
    """Optax (Adam) on an Equinox model: a frozen pretrained feature network and a
    trained head, on a constant dataset; hand-folded: the features computed once."""
    import equinox as eqx
    import optax

    n, d, width, depth = (1024, 64, 256, 4) if quick else (4096, 64, 512, 4)
    keys = jax.random.split(jax.random.key(0), 3)
    frozen = eqx.nn.MLP(d, width, width, depth, activation=jax.nn.gelu, key=keys[0])
    head = eqx.nn.Linear(width, 1, key=keys[1])
    X = jax.random.normal(keys[2], (n, d))
    y = jnp.sin(X[:, :1]) + 0.1 * X[:, 1:2]
    optimizer = optax.adam(1e-3)

    def update(loss, head, opt_state):
        value, grads = jax.value_and_grad(loss)(head)
        updates, opt_state = optimizer.update(grads, opt_state, head)
        return eqx.apply_updates(head, updates), opt_state, value

    def mse(head, features, y):
        return jnp.mean((jax.vmap(head)(features) - y) ** 2)

    def step(head, opt_state, frozen, X, y):  # the frozen part runs on the constant dataset in the loss
        return update(lambda head: mse(head, jax.vmap(frozen)(X), y), head, opt_state)

    def hand_step(head, opt_state, features, y):
        return update(lambda head: mse(head, features, y), head, opt_state)

    features = jax.vmap(frozen)(X)
    variants = {"jax.jit": (eqx.filter_jit(step), (frozen, X, y)),
                ORDERS[0]: (pejit(step, constant_argnums=(2, 3, 4)), (frozen, X, y)),
                "hand-folded": (eqx.filter_jit(hand_step), (features, y))}

    def trainer(fn, rest):
        state = [head, optimizer.init(eqx.filter(head, eqx.is_array))]

        def one():
            state[0], state[1], value = fn(state[0], state[1], *rest)
            return value

        return one

    fns = {name: trainer(fn, rest) for name, (fn, rest) in variants.items()}
    # the first steps from one initial state: the same losses
    losses = {name: [float(fns[name]()) for _ in range(3)] for name in fns}
    fns = {name: trainer(fn, rest) for name, (fn, rest) in variants.items()}
    worst = max(abs(a - b) / abs(b) for name in losses for a, b in zip(losses[name], losses["jax.jit"]))
    if worst > 1e-4:
        raise AssertionError(f"training losses differ from jax.jit's by {worst:.2e}: {losses}")
    return fns, worst


def diffrax_fit() -> tuple[dict, float]:
    """A diffrax parameter fit: the gradient of a loss through ``diffeqsolve`` w.r.t. a
    dynamic damping ``theta``, a constant mass matrix factored in the vector field."""
    import diffrax

    n = 200
    M, K = _mesh(n)
    y0 = jnp.asarray(np.sin(np.linspace(0, np.pi, n)).astype(np.float32))
    target = 0.5 * y0

    def solve(M, K, theta):
        term = diffrax.ODETerm(lambda t, y, a: -jnp.linalg.solve(a[0], a[1] @ y) - a[2] * y)
        return diffrax.diffeqsolve(term, diffrax.Tsit5(), 0., 1., 0.05, y0, args=(M, K, theta)).ys[-1]

    def hand(MK, theta):
        term = diffrax.ODETerm(lambda t, y, a: -(a[0] @ y) - a[1] * y)
        return diffrax.diffeqsolve(term, diffrax.Tsit5(), 0., 1., 0.05, y0, args=(MK, theta)).ys[-1]

    fns = _orders(lambda M, K, theta: (solve(M, K, theta) - target) ** 2, (M, K), jnp.float32(0.3),
                  lambda MK, theta: (hand(MK, theta) - target) ** 2, jnp.linalg.solve(M, K), closed=False)
    return fns, _check(fns, "jax.jit", 1e-4)


#: name -> (maker, targets: ``(variant, reference, limit)``)
PROGRAMS: dict[str, tuple[Callable, tuple]] = {
    "diffrax gradient, the issue's program (M, K 200x200, linear field)":
        (lambda quick: diffrax_gradient(False), ((ORDERS[0], "hand-folded", 1.2), (ORDERS[1], "hand-folded", 1.2))),
    "diffrax gradient, the field + 0.1 sin(y)":
        (lambda quick: diffrax_gradient(True), ((ORDERS[0], "hand-folded", 1.2), (ORDERS[1], "hand-folded", 1.2))),
    "Equinox filter_custom_vjp gradient (inv(A) @ x, A 300x300)":
        (lambda quick: equinox_gradient(), ((ORDERS[0], "hand-folded", 1.1), (ORDERS[1], "hand-folded", 1.1),
                                            (ORDERS[0], "jax.jit", 0.1), (ORDERS[1], "jax.jit", 0.1))),
    "optimistix root-find gradient (inv(B) in fn, B 200x200)":
        (lambda quick: optimistix_gradient(), ((ORDERS[0], "hand-folded", 1.2), (ORDERS[1], "hand-folded", 1.2))),
    "Optax training step, Equinox model: frozen MLP features, trained head":
        (training_loop, ((ORDERS[0], "hand-folded", 1.2), (ORDERS[0], "jax.jit", 0.2))),
    "diffrax parameter fit (damping, mass matrix 200x200 solved in the field)":
        (lambda quick: diffrax_fit(), ((ORDERS[0], "hand-folded", 1.2), (ORDERS[1], "hand-folded", 1.2))),
}


def side_by_side(fns: dict[str, Callable[[], Any]], ref: str, calls: int, pairs: int) -> dict:
    """:func:`paired`'s figures, each variant paired with ``ref`` alone, and its ratio to ``jax.jit``'s.

    In one round of every variant, the one that runs after another pays for
    what that one leaves behind (``jax.jit``'s step, which factors a matrix on
    every call, leaves threads and caches busy), enough to make a step that
    matches the hand-folded one side by side look markedly slower.
    """
    runs = {k: paired({k: fn, ref: fns[ref]}, ref, calls, pairs) for k, fn in fns.items() if k != ref}
    ratio = {k: r["ratio"][k] for k, r in runs.items()}
    return {
        "times": {k: r["times"][k] for k, r in runs.items()}
        | {ref: statistics.median(r["times"][ref] for r in runs.values())},
        "extra": {k: r["extra"][k] for k, r in runs.items()},
        "ratio": ratio,
        "ratio_to": {"jax.jit": {k: ratio.get(k, 1.0) / ratio["jax.jit"] for k in fns}},
    }


def case16(ctx) -> dict:
    """Gradient and training steps through diffrax, optimistix, Equinox and Optax, both orders, vs hand-folded."""
    out = {}
    calls, pairs = (5, 21) if ctx.quick else (10, 41)
    for name, (make, _) in PROGRAMS.items():
        try:
            fns, error = make(ctx.quick)
        except ImportError as e:  # the libs extra brings them
            out[name] = {"error": f"{e.name} is not installed"}
            continue
        r = side_by_side(fns, "hand-folded", calls, pairs)
        r["max_rel_difference"] = error
        out[name] = r
        print(f"  {name}: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in r["times"].items()), flush=True)
    return out


def _ratio(r: dict, variant: str, ref: str) -> float:
    return r["ratio_to"][ref][variant] if ref in r.get("ratio_to", {}) else r["ratio"][variant]


def targets(results: dict, target: Callable) -> list:
    """Case 16's targets, as ``target(name, passed, detail)``."""
    out = []
    for name, r in results.get(16, {}).items():
        for variant, ref, limit in PROGRAMS[name][1]:
            if "error" in r:
                out.append(target(f"case 16: {name}, {variant} <= {limit}x {ref}", None, r["error"]))
                continue
            ratio = _ratio(r, variant, ref)
            out.append(target(f"case 16: {name}, {variant} per step <= {limit}x {ref}'s", ratio <= limit,
                              f"{r['times'][variant] * 1e3:.3f} ms / {r['times'][ref] * 1e3:.3f} ms: {ratio:.3f}"
                              " (median of ratios paired by round)"))
    return out


def section16(r: dict) -> list[str]:
    rows = ["## Case 16: gradient and training steps (issue 63)", "",
            ("Per step, medians of rounds in which each variant and the hand-folded step run back to back; "
             f"ratios paired by round. '{ORDERS[0]}': `pejit` of a function calling `jax.grad`; '{ORDERS[1]}': `jax.jit(jax.grad(...))` "
             "of a pejit function. Hand-folded: the constant work done once by hand, the rest under `jax.jit`."), "",
            "| program | variant | per step | / hand-folded | / jax.jit |", "|---|---|---|---|---|"]
    for name, t in r.items():
        if "error" in t:
            rows.append(f"| {name} | n/a | {t['error']} | | |")
            continue
        for variant, seconds in t["times"].items():
            to_hand = t["ratio"].get(variant, 1.0)
            to_jit = t["ratio_to"]["jax.jit"][variant]
            rows.append(f"| {name} | {variant} | {seconds * 1e3:.3f} ms | {to_hand:.3f} | {to_jit:.3f} |")
    return rows
