"""New constant values of one structure reuse one trace (the folding program)
when the residual keeps custom_jvp/custom_vjp calls, branches or loops whose
structure does not depend on the values; value-dependent ones trace per value."""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pejit import FoldOptions, pejit

from ._util import JAX_VERSION, Counter, primitive_names


def spd(seed, n=8):
    m = np.random.default_rng(seed).normal(size=(n, n)).astype(np.float32)
    return jnp.asarray(m @ m.T + n * np.eye(n, dtype=np.float32))


def mlp_params(seed, sizes=(8, 16, 16, 3)):
    rng = np.random.default_rng(seed)
    return [
        (jnp.asarray(rng.normal(size=(m, n)), jnp.float32), jnp.asarray(rng.normal(size=m), jnp.float32))
        for n, m in zip(sizes[:-1], sizes[1:])
    ]


def relu_mlp(params, x):
    *hidden, (w, b) = params
    for wi, bi in hidden:
        x = jax.nn.relu(wi @ x + bi)  # jax.nn.relu is a custom_jvp function
    return w @ x + b


@jax.custom_vjp
def clipped_dot(w, x):
    """``w @ x`` whose gradient (a custom_vjp rule) is clipped to [-1, 1]."""
    return w @ x


clipped_dot.defvjp(
    lambda w, x: (w @ x, (w, x)),
    lambda res, g: (jnp.clip(jnp.outer(g, res[1]), -1, 1), jnp.clip(res[0].T @ g, -1, 1)),
)


def custom_vjp_fun(a, x):
    # One call with a dynamic input (stays, its rule applies) and one whose
    # inputs are all known (folded whole, also in the folding program).
    return clipped_dot(jnp.linalg.inv(a), x) + clipped_dot(a, a[0]).sum()


def cond_fun(a, x):
    # The predicate depends on x only; the known work in both branches is hoisted.
    return lax.cond(x.sum() > 0, lambda x: jnp.linalg.inv(a) @ x, lambda x: jnp.cos(a) @ x, x)


def scan_fun(a, x):
    def body(c, _):
        return jnp.linalg.inv(a) @ c + jnp.sin(a).sum(), None  # loop-invariant known work

    return lax.scan(body, x, None, length=3)[0]


def fori_fun(a, x):
    # A known carry (the counter) indexes known work: split from the residual loop.
    return lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c + jnp.linalg.inv(a)[i]), x)


def while_fun(a, x):
    def body(c):
        return c[0] + 1, jnp.linalg.inv(a) @ c[1]

    return lax.while_loop(lambda c: (c[0] < 3) & (jnp.abs(c[1]).sum() < 1e3), body, (0, x))[1]


def counted_while_fun(a, x):
    # The trip count is decided by literals: known, and the same for every value.
    return lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.linalg.inv(a) @ c[1]), (0, x))[1]


def checkpoint_fun(a, x):
    return jax.checkpoint(lambda x: jnp.sin(jnp.linalg.inv(a) @ x))(x)


def known_cond_fun(a, x):
    # A cond whose index and operands are all known is folded whole.
    b = lax.cond(a[0, 1] < -1, jnp.linalg.inv, lambda a: -a, a)
    return jax.nn.relu(b @ x)


CASES = {
    "relu_mlp": (relu_mlp, mlp_params, "lu"),
    "custom_vjp": (custom_vjp_fun, spd, "lu"),
    "cond": (cond_fun, spd, "lu"),
    "scan": (scan_fun, spd, "lu"),
    "fori_loop": (fori_fun, spd, "lu"),
    "while_loop": (while_fun, spd, "lu"),
    "counted_while": (counted_while_fun, spd, "lu"),
    "checkpoint": (checkpoint_fun, spd, "lu"),
    "known_cond": (known_cond_fun, spd, "lu"),
}


def value_dependent_twin(fun):
    """``fun``, but Python reads a constant's value: traced concretely, per value."""

    def twin(c, x):
        if not all(bool(jnp.isfinite(leaf).all()) for leaf in jax.tree.leaves(c)):
            raise ValueError("non-finite constant")
        return fun(c, x)

    return twin


# An MLP with frozen weights folds nothing (every product involves x): pejit
# says so with NothingFoldedWarning; here the point is re-specialization, so
# min_gain=0 folds what is known, however little (these programs are small).
@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
@pytest.mark.parametrize("name", CASES)
def test_new_values_reuse_one_trace(name):
    fun, make, folded_away = CASES[name]
    counted = Counter(fun)
    f = pejit(counted, constant_argnums=0, fold_options=FoldOptions(min_gain=0.0))
    xs = [jnp.arange(8.0) - 1.0, -jnp.arange(8.0)]  # both branches of cond_fun
    specs = []
    for seed in range(3):
        c = make(seed)
        for x in xs:
            np.testing.assert_allclose(f(c, x), jax.jit(fun)(c, x), rtol=2e-4, atol=1e-5)
        specs.append(f.specialize(c, xs[0]))
    assert counted.calls == 1
    assert specs[0].program is specs[1].program is specs[2].program
    assert specs[2].program.folding_program.compiled is not None  # later values: one run of the folding program
    assert specs[2].report.fallbacks == ()
    # The known work is folded, not left in the residual (nor in its loop bodies or branches).
    assert folded_away not in primitive_names(specs[2].program.jaxpr)


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
@pytest.mark.parametrize("name", CASES)
def test_abstract_residual_is_the_concrete_one(name):
    # The residual traced with abstract constants has the structure of the
    # one a concrete trace gives (folded scalars aside: those are literals).
    if name.startswith("custom") and JAX_VERSION < (0, 9):
        pytest.skip("JAX < 0.9 stages custom_jvp/custom_vjp calls on known inputs instead of folding them "
                    "whole when constants are concrete (same results, other residual)")
    fun, make, _ = CASES[name]
    c, x = make(0), jnp.arange(8.0) - 1.0
    abstract = pejit(fun, constant_argnums=0).specialize(c, x)
    concrete = pejit(value_dependent_twin(fun), constant_argnums=0).specialize(c, x)
    assert abstract.program.folding_program is not None and concrete.program.folding_program is None
    assert primitive_names(abstract.program.jaxpr) == primitive_names(concrete.program.jaxpr)


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # the MLP folds nothing
def test_custom_rules_still_apply_to_the_dynamic_arguments():
    f = pejit(custom_vjp_fun, constant_argnums=0)
    x = 10 * jnp.arange(8.0)
    for seed in range(3):  # the third runs the compiled folding program
        a = spd(seed)
        grad = jax.grad(lambda x: f(a, x).sum())(x)
        np.testing.assert_allclose(grad, jax.grad(lambda x: custom_vjp_fun(a, x).sum())(x), rtol=1e-5)
        assert np.abs(grad).max() <= 1  # the clipping rule ran
    residual = primitive_names(f.specialize(a, x).program.jaxpr)
    assert residual.count("custom_vjp_call") == 1  # the all-known call was folded whole

    g = pejit(relu_mlp, constant_argnums=0)
    for seed in range(3):
        params = mlp_params(seed)
        want = jax.grad(lambda x: relu_mlp(params, x).sum())(x)
        np.testing.assert_allclose(jax.grad(lambda x: g(params, x).sum())(x), want, rtol=1e-5)
    assert "custom_jvp_call" in primitive_names(g.specialize(params, x).program.jaxpr)


@pytest.mark.parametrize(
    "fun, reason",
    [
        # the predicate is known: the branch taken depends on the value
        (
            lambda a, x: lax.cond(a[0, 0] > 4, lambda x: jax.nn.relu(a @ x), lambda x: -x, x),
            "branch is chosen by constants",
        ),
        (lambda a, x: jax.nn.relu(a @ x) if a[0, 0] > 4 else -x, "TracerBoolConversionError"),
        # Python reads the trip count from a constant
        (lambda a, x: lax.fori_loop(0, int(a[0, 0]), lambda i, c: jnp.sin(c), x), "needs constant values"),
        # so does JAX's fori_loop (a scan when the bounds are concrete, a while loop otherwise)
        (lambda a, x: lax.fori_loop(0, a[0, 0].astype(int), lambda i, c: jnp.sin(c), x), "trip count"),
    ],
)
def test_value_dependent_structure_traces_per_value(fun, reason):
    f = pejit(fun, constant_argnums=0)
    x = jnp.arange(8.0)
    for a in (spd(0), -spd(1), spd(2), -spd(0)):
        np.testing.assert_allclose(f(a, x), fun(a, x), rtol=1e-5)
        (note,) = f.report(a, x).fallbacks
        assert "each new constant value is traced and folded again" in note and reason in note
        assert "cond" not in f.report(a, x).residual
        assert "while" not in f.report(a, x).residual
    # the residual is differentiable (no while loop, no value-dependent branch)
    np.testing.assert_allclose(jax.grad(lambda x: f(a, x).sum())(x), jax.grad(lambda x: fun(a, x).sum())(x), rtol=1e-5)


def closing_function(a, x):
    @jax.custom_jvp
    def h(x):
        return jnp.sin(a) @ x  # closes over the constant: JAX folds sin(a) when a is concrete

    h.defjvp(lambda p, t: (h(p[0]), jnp.sin(a) @ t[0]))
    return h(x)


def closing_rule(a, x):
    @jax.custom_jvp
    def h(x):
        return jnp.sin(x)

    h.defjvp(lambda p, t: (h(p[0]), a @ t[0]))  # only the rule closes over the constant
    return h(x)


def closing_rule_on_a_folded_value(a, x):
    b = jnp.sin(a) @ a  # folded (deferred, not a tiny value evaluated at once)

    @jax.custom_jvp
    def h(x):
        return jnp.sin(x)

    h.defjvp(lambda p, t: (h(p[0]), b @ t[0]))
    return h(x)


def closing_callback(a, x):
    return jax.pure_callback(lambda y: np.asarray(a) @ y, jax.ShapeDtypeStruct((8,), jnp.float32), x)


def closing_rule_collecting(a, x):
    # a collection during the trace moves its tracers out of the youngest generation:
    # the search for them then walks the heap
    gc.collect()
    return closing_rule(a, x)


@pytest.mark.parametrize(
    "fun, reason",
    [
        (closing_function, "function 'h' closes over arrays"),
        (closing_rule, "closes over a constant"),
        (closing_rule_on_a_folded_value, "closes over a constant"),
        (closing_callback, "closes over a constant"),
        (closing_rule_collecting, "closes over a constant"),
    ],
)
def test_closures_over_constants_trace_per_value(fun, reason):
    # Python code JAX runs later (a custom rule, a callback) would see a
    # constant's tracer, and JAX folds in custom functions only on concrete
    # values: such structures trace each value concretely, and say why. Where
    # that fold would save too little (a sine of an 8x8 matrix), and nothing
    # JAX runs later reaches a constant's tracer, jax.jit's program serves.
    f = pejit(fun, constant_argnums=0)
    x = jnp.arange(8.0)
    served = fun in (closing_function, closing_rule, closing_rule_collecting)
    for seed in range(3):
        a = spd(seed)
        np.testing.assert_allclose(f(a, x), fun(a, x), rtol=1e-5)
        (note,) = f.report(a, x).fallbacks
        assert reason in note
        assert ("jax.jit's program serves every value" in note) == served
        if fun in (closing_function, closing_rule):  # (the others' derivatives need no test here)
            want = jax.grad(lambda x: fun(a, x).sum())(x)
            np.testing.assert_allclose(jax.grad(lambda x: f(a, x).sum())(x), want, rtol=1e-5)


def test_a_folding_program_folds_what_jax_jit_computes():
    # A second value runs the compiled folding program. Compiled at another
    # optimization level than jax.jit's, XLA:CPU rounds rsqrt and sums a
    # transposed array differently (JAX's linalg_test testRsf2csf0 and
    # lax_numpy_reducers_test testAverageNDWeights3 then failed by a few ulps).
    def known(a):
        return lax.rsqrt(jnp.abs(a) + 1.0), lax.reduce_sum(lax.reshape(a[:4, :6], (2, 3, 4), dimensions=(1, 0)), (2, 0, 1))

    def fun(a, x):
        r, s = known(a)
        return r @ x, s * x

    f = pejit(fun, constant_argnums=0)
    rng = np.random.default_rng(0)
    x = jnp.ones(96, jnp.float32)
    for _ in range(3):
        a = jnp.asarray(rng.standard_normal((64, 96)), jnp.float32)
        consts = {np.shape(c): np.asarray(c) for c in f.specialize(a, x).consts}
        r, s = jax.jit(known)(a)
        np.testing.assert_array_equal(consts[(64, 96)], r)
        np.testing.assert_array_equal(consts[()], s)
