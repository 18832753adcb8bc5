"""The IR passes: branch elimination, loop hoisting, calls, cost-aware folding,
constants as buffers, and their ``FoldOptions`` switches.

Each test inspects the residual jaxpr (recursively, sub-jaxprs included) and
compares values with ``jax.jit`` of the same function.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

import pejit
from pejit import FoldOptions
from ._util import cpu_devices, f32_products, requires_jax

#: Primitives of LAPACK-backed linear algebra (what ``inv``/``solve`` lower to).
LAPACK = {"lu", "lu_pivots_to_permutation", "triangular_solve", "cholesky", "custom_linear_solve", "getrf"}

A = jnp.array([[2.0, 0.5, 0.0], [0.1, 3.0, 0.2], [0.0, 0.3, 1.5]])
X = jnp.array([1.0, -2.0, 0.5])


def prims(jaxpr) -> list[str]:
    """Primitive names of every equation, sub-jaxprs included."""
    jaxpr = jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr
    names = []
    for eqn in jaxpr.eqns:
        names.append(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else [value]:
                if isinstance(sub, (ClosedJaxpr, Jaxpr)):
                    names += prims(sub)
    return names


def residual(fun, *args, constant_argnums=0, **options):
    """``(residual ClosedJaxpr, report, pejit value)`` for ``fun(*args)``."""
    f = pejit.pejit(fun, constant_argnums=constant_argnums, fold_options=FoldOptions(**options))
    spec = f.specialize(*args)
    return spec.residual.jaxpr, spec.report, f(*args)


def assert_matches_jit(fun, *args, **options):
    with f32_products():  # else, on GPUs, TF32 products: jax.jit's and pejit's round apart
        jaxpr, report, got = residual(fun, *args, **options)
        want = jax.jit(fun)(*args)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6), got, want)
    return jaxpr, report


# -- 1. branches ---------------------------------------------------------


def _cond_in_scan(flag, x):
    body = lambda c, _: (lax.cond(flag > 0, jnp.sin, jnp.cos, c), None)  # noqa: E731
    return lax.scan(body, x, length=4)[0]


def _cond_in_while(flag, x):
    body = lambda c: lax.cond(flag > 0, lambda c: 2 * c + 1, lambda c: 3 * c + 1, c)  # noqa: E731
    return lax.while_loop(lambda c: jnp.sum(c) < 100.0, body, x)


def _switch_in_jit(i, x):
    return jax.jit(lambda i, x: lax.switch(i, [jnp.sin, jnp.cos, jnp.tanh], x))(i, x)


def _cond_in_jit_in_scan(flag, x):
    inner = jax.jit(lambda f, c: lax.cond(f > 0, jnp.sin, jnp.cos, c))
    return lax.scan(lambda c, _: (inner(flag, c), None), x, length=3)[0]


@pytest.mark.parametrize(
    "fun, const",
    [
        (lambda p, x: lax.cond(p, jnp.sin, jnp.cos, x), True),
        (lambda i, x: lax.switch(i, [jnp.sin, jnp.cos, jnp.tanh], x), 1),
        (_cond_in_scan, 1.0),
        (_cond_in_while, -1.0),
        (_switch_in_jit, 2),
        (_cond_in_jit_in_scan, 1.0),
    ],
    ids=["cond", "switch", "in_scan", "in_while", "in_jit", "in_jit_in_scan"],
)
def test_known_index_leaves_only_the_taken_branch(fun, const):
    # the index of a Python constant XLA resolves in jax.jit's program too (nothing worth
    # folding): min_gain=0 has pejit resolve it, the pass being the point
    jaxpr, report = assert_matches_jit(fun, const, X, min_gain=0.0)
    assert "cond" not in prims(jaxpr)
    assert report.eliminated_branches >= 1


def test_unknown_index_hoists_known_work_out_of_branches():
    def f(A, x):
        branches = [lambda x: jnp.linalg.inv(A) @ x, lambda x: x * A[0, 0], jnp.cos]
        return lax.switch(jnp.int32(x[0]), branches, x)

    for x in (X, -X, 2 * X):
        jaxpr, _ = assert_matches_jit(f, A, x)
        names = prims(jaxpr)
        assert "cond" in names and not LAPACK & set(names)


@pytest.mark.parametrize("where", ["branch", "while body"])
def test_callbacks_in_code_that_may_not_run_are_not_folded(where):
    # Equinox's error checks: a callback that raises, in a branch taken (or a body run)
    # only when the check fails. The fold hoists known work from such code whether it
    # runs or not: it must not run the callback. (XLA may run it: a pure callback is
    # hoisted and speculated like any pure operation, under jax.jit too.)
    def check(ok):
        return jax.pure_callback(lambda ok: np.asarray(ok) if ok else _raise(), jax.ShapeDtypeStruct((), bool), ok)

    def f(A, x):
        if where == "branch":
            return lax.cond(x[0] > 0, lambda x: x + check(A[0, 0] < 0), lambda x: x, x)
        return lax.while_loop(lambda c: c[0] > 10, lambda c: (c[0] + check(A[0, 0] < 0), 2 * c[1]), (x[0], x))[1]

    residual = pejit.pejit(f, constant_argnums=0).specialize(A, -X)  # the check fails on A
    assert prims(residual.residual.jaxpr).count("pure_callback") == 1
    assert residual.report.effects_kept["pure_callback"] == 1
    assert_matches_jit(f, -A, X)  # where the check passes, jax.jit's values


def _raise():
    raise ValueError("a check that fails")


# -- 2. loops ------------------------------------------------------------


def _scan_inv(A, x):
    return lax.scan(lambda c, _: (jnp.linalg.inv(A) @ c, None), x, length=100)[0]


def test_scan_hoists_loop_invariant_inverse():
    jaxpr, _ = assert_matches_jit(_scan_inv, A, X)
    names = prims(jaxpr)
    assert "scan" in names and "dot_general" in names
    assert not LAPACK & set(names)


def test_gradient_of_a_scan_with_hoisted_work_in_its_derivative():
    """The derivative's fold hoists ``abs(b)`` out of the JVP's scan, whose tangent
    inputs JAX 0.7 transposes by scan's ``linear`` flags: they must survive hoisting."""
    def f(a, b):
        def body(carry, x):
            new = jnp.tanh(carry * x + jnp.abs(b))
            return new, jnp.sum(new)

        carry, ys = lax.scan(body, a, jnp.stack([a, a, b]))
        return carry + jnp.mean(ys)

    a, b = jnp.linspace(0.1, 0.5, 4), jnp.linspace(-1.0, 1.0, 4)
    folded = pejit.pejit(f, constant_argnums=1)
    want = jax.grad(lambda a: jnp.sum(f(a, b)))(a)
    np.testing.assert_allclose(jax.grad(lambda a: jnp.sum(folded(a, b)))(a), want, rtol=1e-5)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda a: jnp.sum(folded(a, b))))(a), want, rtol=1e-5)


def test_while_hoists_from_body_and_condition():
    def f(A, x):
        cond = lambda c: jnp.sum(jnp.linalg.inv(2 * A) @ c[1]) < 50.0  # noqa: E731
        body = lambda c: (c[0] + 1, jnp.linalg.inv(A) @ c[1] + c[1])  # noqa: E731
        return lax.while_loop(cond, body, (0, x))

    jaxpr, _ = assert_matches_jit(f, A, X)
    names = prims(jaxpr)
    assert "while" in names and not LAPACK & set(names)


def test_fori_loop_hoists_invariant_work():
    jaxpr, _ = assert_matches_jit(lambda A, x: lax.fori_loop(0, 10, lambda i, c: jnp.linalg.inv(A) @ c * i, x), A, X)
    assert not LAPACK & set(prims(jaxpr))


def _per_iteration(A, x):
    return lax.fori_loop(0, 10, lambda i, c: jnp.linalg.inv(A + i) @ c, x)


def test_known_counter_work_folds_into_stacked_residuals():
    # inv(A + i) depends on the known counter: folded once per iteration, its
    # 10 results stacked into one constant the residual loop scans over.
    jaxpr, report = assert_matches_jit(_per_iteration, A, X)
    assert not LAPACK & set(prims(jaxpr))
    assert report.folded_bytes == 10 * A.nbytes


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # work stays in the loop, on purpose
def test_stacked_residuals_respect_the_budget():
    jaxpr, report = assert_matches_jit(_per_iteration, A, X, loop_residual_bytes=10 * A.nbytes - 1)
    assert LAPACK & set(prims(jaxpr))
    assert report.folded_bytes < 10 * A.nbytes


def test_known_scanned_inputs_fold():
    f = lambda As, x: lax.scan(lambda c, a: (jnp.linalg.inv(a) @ c, jnp.sum(c)), x, As)  # noqa: E731
    jaxpr, _ = assert_matches_jit(f, jnp.stack([A, 2 * A, A.T]), X)
    assert not LAPACK & set(prims(jaxpr))


def test_fully_known_loops_fold_entirely():
    def f(A, x):
        s = lax.fori_loop(0, 5, lambda i, c: c @ A + i, A)
        w = lax.while_loop(lambda c: c[0] < 4, lambda c: (c[0] + 1, c[1] @ A), (0, A))[1]
        return (s + w) @ x

    jaxpr, _ = assert_matches_jit(f, A, X)
    assert prims(jaxpr) == ["dot_general"]


def test_while_known_carries_fold():
    # The counter is known on every iteration and alone decides termination:
    # its final value is a constant of the residual program.
    f = lambda A, x: lax.while_loop(lambda c: c[0] < 7, lambda c: (c[0] + 1, A @ c[1]), (0, x))  # noqa: E731
    jaxpr, _ = assert_matches_jit(f, A, X, min_gain=0.0)  # (a counter's work pays nothing: the pass is the point)
    consts = dict(zip(jaxpr.jaxpr.constvars, jaxpr.consts))
    assert consts[jaxpr.jaxpr.outvars[0]] == 7


def test_loop_effects_stay_and_run_every_iteration():
    seen = []

    def f(A, x):
        def body(c):
            jax.debug.callback(lambda i: seen.append(int(i)), c[0])
            return c[0] + 1, jnp.linalg.inv(A) @ c[1]

        return lax.while_loop(lambda c: c[0] < 3, body, (0, x))[1]

    jaxpr, _ = assert_matches_jit(f, A, X)
    assert "debug_callback" in prims(jaxpr) and not LAPACK & set(prims(jaxpr))
    seen.clear()
    jax.block_until_ready(pejit.pejit(f, constant_argnums=0)(A, X))
    jax.effects_barrier()
    assert seen == [0, 1, 2]


def test_effects_on_constants_in_loop_bodies_stay(capfd):
    def f(A, x):
        def body(c, _):
            jax.debug.print("a00 = {}", A[0, 0])
            return 2 * c, None

        return lax.scan(body, x, length=2)[0]

    g = pejit.pejit(f, constant_argnums=0)
    capfd.readouterr()
    for _ in range(2):
        jax.block_until_ready(g(A, X))
    jax.effects_barrier()
    assert capfd.readouterr().out.count("a00 = 2.0") == 4


# -- 3. calls ------------------------------------------------------------


def test_nested_jit_with_mixed_inputs_is_specialized():
    f = lambda A, x: jax.jit(lambda a, y: jnp.linalg.inv(a) @ y + y)(A, x)  # noqa: E731
    jaxpr, _ = assert_matches_jit(f, A, X)
    assert "jit" not in prims(jaxpr) and not LAPACK & set(prims(jaxpr))


def test_nested_jit_closing_over_constants_is_specialized():
    def f(A, x):
        solve = jax.jit(lambda y: jnp.linalg.inv(A) @ y)
        return solve(x)

    jaxpr, _ = assert_matches_jit(f, A, X)
    assert not LAPACK & set(prims(jaxpr))


def _mixed(c, x):
    """A call like TFC's basis: known work on ``c`` and small expansions, then a product with ``x``."""
    h = jnp.sin(c)[:, None] * jnp.arange(4.0) + jnp.cos(c)[:, None] ** 2  # known
    wide = jnp.broadcast_to(c[:1], (256, 4))  # known, but an expansion that stays lazy
    branch = lax.cond(c[0] > 0, jnp.exp, jnp.tanh, c)  # known, but left to the branches rule
    return (h * 2.0) @ x + wide.sum() * branch


def test_a_nested_call_folds_its_known_part_as_one_recipe(monkeypatch):
    """The known equations of a call with mixed inputs are not traced one by one."""
    from pejit._fold._folding import Folder
    from pejit._residual.rules import calls

    c, x = jnp.linspace(0.1, 1.0, 6), jnp.arange(4.0)
    f = lambda c, x: jax.jit(_mixed)(c, x)  # noqa: E731
    closed = jax.make_jaxpr(_mixed)(c, x)
    part, rest, inputs = calls.known_part(closed, (True, False), Folder())
    assert inputs == (0,)
    assert {"sin", "cos", "mul", "integer_pow", "add"} <= set(prims(part)) and "dot_general" not in prims(part)
    assert {"dot_general", "cond", "broadcast_in_dim"} <= set(prims(rest))  # rules and laziness decide there
    seen, default = [], Folder.default
    monkeypatch.setattr(Folder, "default", lambda self, trace, prim, *a: seen.append(prim.name) or default(self, trace, prim, *a))
    jaxpr, report = assert_matches_jit(f, c, x)
    assert "sin" not in seen and "cos" not in seen  # folded with the known part, not one by one
    assert report.folded["sin"] == 1  # counted as folded all the same
    assert prims(jaxpr) == ["dot_general", "add"]


def test_an_inline_call_with_mixed_inputs_is_inlined_and_its_equal_known_work_folds_once(monkeypatch):
    """``jit(inline=True)`` (every ``jax.numpy`` function) is inlined, as JAX
    inlines it: two calls on the same known input fold its known
    work once, where a known part per call computed it twice (TFC's
    full-size PDE: 2029 equal folds found instead of 885, 2 s of its 11)."""
    from pejit._fold import _abstract, _device, _offload

    scaled = jax.jit(lambda c, x: (2.0 * jnp.sin(c) + 1.0) * x, inline=True)
    shifted = jax.jit(lambda c, x: (2.0 * jnp.sin(c) + 1.0) - x, inline=True)  # another body, the same known work
    f = lambda c, x: scaled(c, x) + shifted(c, x)  # noqa: E731
    evaluated = []
    bind_known, take = _abstract.bind_known, _offload.Kernels.take

    def taken(kernels, recipe, args):  # by the program the worker compiled while traced
        out = take(kernels, recipe, args)
        if out is not None:
            evaluated.append(recipe.prim.name)
        return out

    monkeypatch.setattr(_abstract, "bind_known",
                        lambda prim, *a, **k: evaluated.append(prim.name) or bind_known(prim, *a, **k))
    monkeypatch.setattr(_offload.Kernels, "take", taken)
    c, x = jnp.linspace(0.1, 1.0, 300), jnp.arange(300.0)  # not tiny: tiny folds are evaluated on the spot
    # folded before the call returns, not left to XLA with c compiled in (nor folded beside the call)
    options = FoldOptions(backend="eager", min_gain=0, beside=False)
    g = pejit.pejit(c, x, constant_arg_nums=[0], fold_options=options)(f)
    np.testing.assert_allclose(g(x), jax.jit(f)(c, x), rtol=1e-6)
    # once, and not inside a known part; with pejit's CPU back end, NumPy
    # computes the product and the sum (host rules), JAX only the sine
    assert evaluated == (["sin"] if _device.host_computes() else ["sin", "mul", "add"])
    assert sorted(prims(g.specialize(x).residual.jaxpr)) == ["add", "mul", "sub"]


def test_checkpoint_keeps_its_body_folded_and_its_rule():
    f = lambda A, x: jnp.sum(jax.checkpoint(lambda y: jnp.sin(jnp.linalg.inv(A) @ y))(x))  # noqa: E731
    jaxpr, _ = assert_matches_jit(f, A, X)
    names = prims(jaxpr)
    assert "checkpoint" in names or "remat2" in names
    assert not LAPACK & set(names)
    got = jax.grad(pejit.pejit(f, constant_argnums=0), argnums=1)(A, X)
    np.testing.assert_allclose(got, jax.grad(f, argnums=1)(A, X), rtol=1e-5)


@jax.custom_vjp
def _scaled(a, x):
    return jnp.sin(a) * x


def _scaled_fwd(a, x):
    return _scaled(a, x), (a, x)


def _scaled_bwd(res, g):  # deliberately not the derivative of the primal
    a, x = res
    return 7.0 * g * x, 3.0 * g * a


_scaled.defvjp(_scaled_fwd, _scaled_bwd)


@jax.custom_jvp
def _clipped(a, x):
    return jnp.sin(a) * x


@_clipped.defjvp
def _clipped_jvp(primals, tangents):
    return _clipped(*primals), 5.0 * tangents[1]


@pytest.mark.parametrize("custom", [_scaled, _clipped], ids=["custom_vjp", "custom_jvp"])
def test_custom_rules_govern_derivatives_of_dynamic_inputs(custom):
    loss = lambda a, x: jnp.sum(custom(2.0 * a, x) ** 2)  # noqa: E731
    jaxpr, _ = assert_matches_jit(loss, X, A[0])
    assert any(n.startswith("custom_") for n in prims(jaxpr))
    got = jax.grad(pejit.pejit(loss, constant_argnums=0), argnums=1)(X, A[0])
    want = jax.grad(jax.jit(lambda x: loss(X, x)))(A[0])
    autodiff = jax.grad(lambda x: jnp.sum((jnp.sin(2.0 * X) * x) ** 2))(A[0])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert not np.allclose(got, autodiff)  # the custom rule was used


def test_custom_rule_inside_a_loop_body_survives_hoisting():
    def loss(a, x):
        body = lambda c, _: (_scaled(jnp.linalg.norm(a) * a, c), None)  # noqa: E731
        return jnp.sum(lax.scan(body, x, length=3)[0])

    jaxpr, _ = assert_matches_jit(loss, X, A[0], min_gain=0.0)  # (a norm of 8: else left to jax.jit)
    names = prims(jaxpr)
    assert "custom_vjp_call" in names and "sqrt" not in names  # the norm was hoisted
    got = jax.grad(pejit.pejit(loss, constant_argnums=0), argnums=1)(X, A[0])
    np.testing.assert_allclose(got, jax.grad(jax.jit(lambda x: loss(X, x)))(A[0]), rtol=1e-6)


@requires_jax((0, 9), "custom_jvp/custom_vjp calls on known inputs are staged, not folded whole (same results)")
@pytest.mark.parametrize("custom", [_scaled, _clipped], ids=["custom_vjp", "custom_jvp"])
def test_custom_rules_with_known_inputs_fold(custom):
    jaxpr, _ = assert_matches_jit(lambda a, x: custom(a, a) * x, X, A[0], min_gain=0.0)
    assert prims(jaxpr) == ["mul"]


# -- 4. cost-aware folding -------------------------------------------------


def test_expansion_is_not_materialized():
    f = lambda c, x: jnp.ones((4096, 4096)) * c + x  # noqa: E731
    x = jnp.ones((4096, 4096))
    jaxpr, report = residual(f, 2.0, x)[:2]
    assert report.folded_bytes <= 1024
    assert "broadcast_in_dim" in prims(jaxpr)
    np.testing.assert_array_equal(pejit.pejit(f, constant_argnums=0)(2.0, x[:1, :1]), 3.0)


def test_expensive_work_feeding_an_expansion_still_folds():
    f = lambda A, x: jnp.broadcast_to(jnp.linalg.inv(A), (64, 3, 3)) + x  # noqa: E731
    jaxpr, report = assert_matches_jit(f, A, jnp.ones((64, 3, 3)))
    names = prims(jaxpr)
    assert "broadcast_in_dim" in names and not LAPACK & set(names)
    assert report.folded_bytes == A.nbytes


def test_expansion_feeding_a_matrix_product_is_stored():
    # XLA fuses an expansion into an elementwise consumer, not into a
    # dot_general: recomputing it there would cost memory traffic every call.
    # (min_gain=0: the mechanism itself; storing 2 KiB saves too little of a call to pay)
    f = lambda A, x: jnp.broadcast_to(jnp.linalg.inv(A), (64, 3, 3)) @ x  # noqa: E731
    jaxpr, report = assert_matches_jit(f, A, jnp.ones((64, 3, 1)), affine=False, min_gain=0.0)
    assert prims(jaxpr) == ["dot_general"]
    assert report.folded_bytes == 64 * A.nbytes
    assert not report.rematerialized and report.folded["broadcast_in_dim"] == 1
    # By default the product contracts against inv(A) itself (issue 25):
    # neither stored nor recomputed.
    jaxpr, report = assert_matches_jit(f, A, jnp.ones((64, 3, 1)))
    assert prims(jaxpr) == ["dot_general", "transpose"] and report.folded_bytes == A.nbytes


def test_expansion_feeding_both_kinds_of_consumer_is_stored_once():
    def f(c, x):
        big = jnp.ones((256, 256)) * c
        return big @ x + big

    jaxpr, report = assert_matches_jit(f, 2.0, jnp.ones((256, 256)), min_gain=0.0)  # the mechanism itself
    assert prims(jaxpr) == ["dot_general", "add"]  # both read the one stored constant
    assert report.folded_bytes == 256 * 256 * 4


# -- 5. constants as buffers -----------------------------------------------


def test_scalars_become_literals_and_arrays_arguments():
    f = lambda B, s, v: jnp.cos(B) @ v * jnp.sum(s)  # noqa: E731
    B = jnp.linspace(0.0, 1.0, 256 * 256).reshape(256, 256)
    jaxpr, report = residual(f, B, 3.0, jnp.ones(256), constant_argnums=(0, 1))[:2]
    assert [c.shape for c in jaxpr.consts] == [(256, 256)]
    literals = [a.val for e in jaxpr.jaxpr.eqns for a in e.invars if isinstance(a, Literal)]
    assert 3.0 in literals

    hlo = pejit.pejit(f, constant_argnums=(0, 1)).lower(B, 3.0, jnp.ones(256)).as_text()
    main = next(line for line in hlo.splitlines() if "func.func public @main" in line)
    assert "%arg0: tensor<256x256xf32>" in main
    assert not re.search(r"dense<[^>]{100,}", hlo)  # no large constant in the program


# -- 7. every pass has a switch ----------------------------------------------

_SWITCHED = {
    "branches": (lambda p, x: lax.cond(p, jnp.sin, jnp.cos, x), (True, X)),
    # (tanh: an affine call would be collapsed whole, see "affine")
    "calls": (lambda A, x: jax.jit(lambda a, y: jnp.tanh(jnp.linalg.inv(a) @ y))(A, x), (A, X)),
    "loops": (_scan_inv, (A, X)),
    # (not uniform: a uniform constant becomes a broadcast of a literal anyway)
    "rematerialize": (lambda c, x: jnp.broadcast_to(jnp.arange(64.0), (64, 64)) * c + x, (2.0, jnp.ones((64, 64)))),
    # a folded scalar (a Python scalar constant is a literal of the traced program already)
    "literals": (lambda c, x: x * jnp.sin(jnp.float32(c)), (2.0, X)),
    "affine": (lambda A, x: A @ (A.T @ x), (A, X)),
}


@pytest.mark.parametrize("switch", sorted(_SWITCHED))
@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # with a pass off, nothing may fold
def test_each_pass_can_be_turned_off(switch):
    fun, args = _SWITCHED[switch]
    # min_gain=0: each pass runs wherever it can, however little it saves these small programs
    on_jaxpr, on_report, on = residual(fun, *args, min_gain=0.0)
    off_jaxpr, off_report, off = residual(fun, *args, min_gain=0.0, **{switch: False})
    np.testing.assert_allclose(off, on, rtol=1e-6)
    np.testing.assert_allclose(on, jax.jit(fun)(*args), rtol=1e-5)
    # Off, the residual program does more work or takes more constants.
    more_work = len(prims(off_jaxpr)) > len(prims(on_jaxpr))
    more_consts = len(off_jaxpr.consts) > len(on_jaxpr.consts) or off_report.folded_bytes > on_report.folded_bytes
    assert more_work or more_consts


def test_fold_options_are_validated():
    with pytest.raises(TypeError, match="fold_options"):
        pejit.pejit(lambda x: x, fold_options={"loops": False})


def test_report_counts_hoisted_work():
    report = residual(_scan_inv, A, X)[1]
    assert report.hoisted["jit(inv)"] == report.folded["jit(inv)"] == 1  # the call to inv
    assert "hoisted out of loops" in str(report)


def test_python_control_flow_on_constants_inside_loop_bodies():
    def f(A, x):
        def body(c, _):
            if A.sum() > 0:  # needs A's value while JAX traces the body
                return c * A[A > 0.2].sum(), None  # and a data-dependent shape
            return c, None

        return lax.scan(body, x, length=1)[0]

    got = pejit.pejit(f, constant_argnums=0)(A, X)
    np.testing.assert_allclose(got, X * A[A > 0.2].sum(), rtol=1e-6)
    with pytest.raises(jax.errors.TracerBoolConversionError):
        pejit.pejit(f, constant_argnums=1)(A, X)  # A dynamic: a real error


# -- constants passed once ---------------------------------------------------


@cpu_devices("equal constants are found by their bytes in host memory")
def test_equal_constants_are_passed_once_and_uniform_ones_recomputed():
    def f(c, x):
        K1, K2 = jnp.cos(c), jnp.cos(c + 0.0)  # two folds, one value
        zeros = c * 0.0  # uniform, read by an add only
        return K1 @ x + K2 @ x + (zeros + x)

    c = jnp.linspace(0.0, 1.0, 64 * 64).reshape(64, 64)
    x = jnp.ones(64)
    jaxpr, report = assert_matches_jit(f, c, x)
    assert [k.shape for k in jaxpr.consts] == [(64, 64)]  # K1 and K2 are one buffer
    splats = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "broadcast_in_dim" and isinstance(e.invars[0], Literal)]
    assert [(e.invars[0].val, e.outvars[0].aval.shape) for e in splats] == [(0.0, (64, 64))]


def test_uniform_constant_read_by_a_matrix_product_stays_a_buffer():
    # XLA materializes a broadcast feeding a dot_general on every call
    f = lambda c, x: (c * 0.0 + 1.0) @ x  # noqa: E731
    c = jnp.linspace(0.0, 1.0, 64 * 64).reshape(64, 64)
    # (min_gain=0: the fold itself, where XLA would fold this small work with c compiled in)
    jaxpr, _ = assert_matches_jit(f, c, jnp.arange(64.0), min_gain=0.0)
    assert prims(jaxpr) == ["dot_general"] and [k.shape for k in jaxpr.consts] == [(64, 64)]


def test_sharing_follows_the_values_of_each_specialization():
    # the value-independent program plans sharing on its first value; a
    # value with another pattern of equal and uniform constants gets its own
    def f(a, b, x):
        return jnp.exp(a) @ x + jnp.exp(b) @ x + (a * 1.0 + x)

    # (the residual algebra would fold the two products into one)
    g = pejit.pejit(f, constant_argnums=(0, 1), fold_options=pejit.FoldOptions(affine=False, min_gain=0.0))
    x = jnp.arange(8.0)
    r = jnp.linspace(0.0, 1.0, 64).reshape(8, 8)
    for a, b in ((r, r), (r, r + 1.0), (jnp.ones((8, 8)), r), (r + 2.0, r + 2.0)):
        np.testing.assert_allclose(g(a, b, x), f(a, b, x), rtol=1e-5)
    assert len(g.report(r, r + 1.0, x).buffers) == 3  # exp(a), exp(b) and a
    # exp(a) == exp(b): passed once where pejit reads their bytes, in host
    # memory (CPU devices); values on an accelerator are not copied to compare them
    assert len(g.report(r + 2.0, r + 2.0, x).buffers) == (2 if jax.default_backend() == "cpu" else 3)
