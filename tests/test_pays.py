"""Every pass pays for itself (issue 65): the fold, each loop body's hoisting and the
constants' placement decide by what a call costs, on programs built to sit on each
side of the line. Decisions are asserted on the residual and the report, never on
wall-clock times (``python -m pejit.bench`` measures those).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pejit import FoldOptions, pejit
from pejit._calls import _keys
from pejit._jit import call_path

from ._util import f32_products, primitive_names

rng = np.random.default_rng(0)
SMALL = jnp.asarray(rng.standard_normal((4, 4)), jnp.float32)
BIG = jnp.asarray(rng.standard_normal((256, 256)), jnp.float32)


def _body_names(residual) -> list[str]:
    loop = next(e for e in residual.jaxpr.eqns if e.primitive.name in ("scan", "while"))
    body = loop.params.get("jaxpr") or loop.params["body_jaxpr"]
    return primitive_names(body)


def cheap_in_loop(a, x):
    # per trip: a 256x256 product with the state; the known work, the sines of a
    # 16x16 constant and their sum, is a few hundred FLOPs that XLA computes once
    def body(i, v):
        return jnp.tanh(BIG @ v + jnp.sum(jnp.sin(a)) * v[0])

    return lax.fori_loop(0, 20, body, x)


def library_call_in_loop(a, x):
    return lax.fori_loop(0, 20, lambda i, v: jnp.tanh(jnp.linalg.inv(a) @ v), x)


def test_cheap_known_work_stays_in_a_loop_body():
    a = jnp.tile(SMALL, (4, 4))
    with f32_products():
        f = pejit(cheap_in_loop, constant_argnums=0)
        x = jnp.ones(256)
        # nothing worth folding: jax.jit's program, the constant compiled in, as jax.jit compiles
        # a closed-over array (XLA folds the sum of sines in its own order: the last bits differ,
        # and twenty trips of the product amplify them)
        np.testing.assert_allclose(f(a, x), jax.jit(cheap_in_loop)(a, x), rtol=1e-5, atol=1e-4)
    assert f.specialize(a, x).program.compiled_in
    residual = f.specialize(a, x).residual
    assert "sin" in _body_names(residual)  # kept: carrying it in as a constant would not pay
    assert residual.report.unfolded and not residual.report.hoisted
    assert "stay in the program" in str(residual.report)
    everything = pejit(cheap_in_loop, constant_argnums=0, fold_options=FoldOptions(min_gain=0.0))
    assert "sin" not in _body_names(everything.specialize(a, x).residual)  # min_gain 0: hoisted


def test_a_library_call_in_a_loop_body_is_hoisted():
    # XLA runs an inverse's LAPACK calls on every trip: folding them pays
    with f32_products():
        a = SMALL + 4 * jnp.eye(4)
        f = pejit(library_call_in_loop, constant_argnums=0)
        np.testing.assert_allclose(f(a, jnp.ones(4)), jax.jit(library_call_in_loop)(a, jnp.ones(4)), rtol=1e-5)
    residual = f.specialize(a, jnp.ones(4)).residual
    assert not {"lu", "triangular_solve", "getrf"} & set(_body_names(residual))
    assert not residual.report.unfolded


def test_a_fold_that_saves_too_little_keeps_the_program():
    def f(a, x):  # a 512x512 product on x beside a sum of a 4x4 constant
        return jnp.tanh(x @ x) + jnp.sum(a * a) * x

    x = jnp.asarray(rng.standard_normal((512, 512)), jnp.float32)
    a = jnp.tile(SMALL, (4, 4))  # 16x16: its square's sum is 512 FLOPs of 2.7e8 a call
    spec = pejit(f, constant_argnums=0).specialize(a, x)
    report = spec.report
    assert report.unfolded and not report.unfolded[0].nested
    assert report.folded_eqns == 0 and any("reduce_sum" in name for name in report.residual)
    assert [c.shape for c in spec.consts] == [a.shape]  # the constant itself, as jax.jit's program reads it
    with f32_products():
        np.testing.assert_allclose(pejit(f, constant_argnums=0)(a, x), jax.jit(f)(a, x), rtol=1e-5, atol=1e-5)
    folded = pejit(f, constant_argnums=0, fold_options=FoldOptions(min_gain=0.0)).specialize(a, x)
    assert not any("reduce_sum" in name for name in folded.report.residual) and not folded.report.unfolded


def _scaled_by_a_rule(a, x, traces: list):
    """A 512x512 product through a custom_jvp function whose rule closes over the constant."""
    traces.append(1)

    @jax.custom_jvp
    def scale(v):
        return v * jnp.sum(a * a)

    scale.defjvp(lambda p, t: (scale(p[0]), t[0] * jnp.sum(a * a) * 2.0))  # not autodiff's: seen in the grad
    return jnp.tanh(scale(x @ x))


def test_a_rule_closing_over_a_constant_keeps_jax_jits_program_where_the_fold_saves_too_little():
    # the rule would make each value fold again (the residual's rule holds the
    # constant); where the fold does not pay, jax.jit's program serves every value:
    # evaluating it runs no rule, and pejit's derivative rule differentiates it
    traces: list = []
    f = pejit(functools.partial(_scaled_by_a_rule, traces=traces), constant_argnums=0)
    x = jnp.asarray(rng.standard_normal((512, 512)) / 16, jnp.float32)
    plain = functools.partial(_scaled_by_a_rule, traces=[])
    values = (jnp.tile(SMALL, (4, 4)), jnp.tile(SMALL, (4, 4)) / 2)
    with f32_products():
        for a in values:
            report = f.specialize(a, x).report
            (why,) = report.fallbacks
            assert report.unfolded and "closes over arrays" in why and "jax.jit's program serves every value" in why
            np.testing.assert_allclose(f(a, x), jax.jit(plain)(a, x), rtol=1e-5, atol=1e-5)
    assert len(traces) == 1  # the look's trace: no value was traced again
    for a in values:
        with f32_products():
            grad = jax.grad(lambda x: f(a, x)[0, 0])(x)
            np.testing.assert_allclose(grad, jax.grad(lambda x: plain(a, x)[0, 0])(x), rtol=1e-4, atol=1e-6)
    # JAX differentiates the program itself: each value is traced again, its rule given the value
    g = pejit(plain, constant_argnums=0, fold_options=FoldOptions(derivatives=False))
    a = jnp.tile(SMALL, (4, 4))
    assert any("each new constant value is traced and folded again" in why
               for why in g.specialize(a, x).report.fallbacks)
    with f32_products():
        np.testing.assert_allclose(jax.grad(lambda x: g(a, x)[0, 0])(x), jax.grad(lambda x: plain(a, x)[0, 0])(x),
                                   rtol=1e-4, atol=1e-6)


def test_staged_where_a_rule_closes_over_a_constant_pejits_derivative_rule_stays():
    # jax.jit's program, its constants compiled in, is staged as jax.jit closed over them
    # would stage it, with no derivative rule (Specialization.jax_jit_in), except where
    # its rule closes over the look's tracer of the constant: JAX must not run that rule
    f = pejit(functools.partial(_scaled_by_a_rule, traces=[]), constant_argnums=0)
    plain = functools.partial(_scaled_by_a_rule, traces=[])
    x = jnp.asarray(rng.standard_normal((512, 512)) / 16, jnp.float32)
    a = jnp.tile(SMALL, (4, 4))
    with f32_products():
        spec = f.specialize(a, x)
        assert spec.program.compiled_in and spec.program.rules_close_over_constants and not spec.jax_jit_in
        grad = jax.grad(jax.jit(lambda x: f(a, x)[0, 0]))(x)
        np.testing.assert_allclose(grad, jax.grad(lambda x: plain(a, x)[0, 0])(x), rtol=1e-4, atol=1e-6)


def test_work_without_a_lowering_folds_whatever_it_saves():
    # a primitive with only an impl cannot stay in a compiled program
    from jax.extend.core import Primitive

    probe = Primitive("pays_probe")
    probe.def_impl(lambda a: a + 1.0)
    probe.def_abstract_eval(lambda a: a)

    def f(a, x):
        return jnp.tanh(x @ x) + probe.bind(a)[0, 0] * x

    x = jnp.ones((256, 256))
    spec = pejit(f, constant_argnums=0).specialize(SMALL, x)
    assert "pays_probe" not in spec.report.residual and not spec.report.unfolded


def test_a_scan_is_not_split_for_known_work_that_costs_nothing():
    # a known counter's work (a transpose) would reach the residual loop as stacked inputs
    def f(c, x):
        return lax.fori_loop(0, 3, lambda i, v: jnp.tanh(v @ c.T), x)

    residual = pejit(f, constant_argnums=0, fold_options=FoldOptions(affine=False)).specialize(BIG, jnp.ones(256))
    assert [e.primitive.name for e in residual.residual.jaxpr.eqns] == ["scan"]


def test_a_scan_is_not_split_to_stack_loop_invariant_work_hoisting_declined():
    """Work on constants alone, in a loop whose counter is known: hoisting keeps it (1.8% of
    the work, XLA computes it once a call), so splitting on the counter must not fold it
    again, once per trip, into a stacked constant (the MJX humanoid's step: 445 KB)."""
    b = jnp.asarray(rng.standard_normal((128, 128)), jnp.float32) / 12
    a = jnp.asarray(rng.standard_normal(2048), jnp.float32)

    def f(consts, x):
        a, b = consts
        return lax.fori_loop(0, 10, lambda i, v: jnp.tanh(v @ b) + jnp.mean(jnp.sin(a) * a), x)

    x = jnp.ones(128)
    spec = pejit(f, constant_argnums=0).specialize((a, b), x)
    assert sorted(c.shape for c in spec.consts) == sorted([a.shape, b.shape])  # the constants themselves, nothing stacked
    assert spec.report.folded_eqns == 0 and spec.report.unfolded
    with f32_products():
        np.testing.assert_allclose(pejit(f, constant_argnums=0)((a, b), x), jax.jit(f)((a, b), x), rtol=1e-5,
                                   atol=1e-6)

    def g(consts, x):  # the same loop, where folding pays elsewhere: the split still declines
        return f(consts, x) + jnp.linalg.inv(consts[1]) @ x

    spec = pejit(g, constant_argnums=0).specialize((a, b), x)
    assert spec.program.stats.staged["scan (known part too small to split)"] == 1
    assert max(c.size for c in spec.consts) == b.size  # inv(b); nothing stacked


def test_counter_work_is_split_however_the_invariant_work_went():
    """What differs from trip to trip on a known counter still folds, a library call each trip."""
    def f(a, x):
        return lax.fori_loop(0, 4, lambda i, v: jnp.linalg.solve(a + i, v) + jnp.sum(jnp.sin(a)), x)

    a = SMALL + 4 * jnp.eye(4)
    spec = pejit(f, constant_argnums=0).specialize(a, jnp.ones(4))
    names = set(_body_names(spec.residual))
    assert not {"lu", "getrf"} & names and "triangular_solve" in names  # factorized per trip, now; solved per call
    with f32_products():
        np.testing.assert_allclose(pejit(f, constant_argnums=0)(a, jnp.ones(4)), jax.jit(f)(a, jnp.ones(4)),
                                   rtol=1e-5)


# -- the folded constants compiled in ----------------------------------------------
@pytest.mark.parametrize("shape, compiled_in", [((64, 64), True), ((1024, 512), False)], ids=["small", "large"])
def test_small_folded_constants_are_compiled_in(shape, compiled_in):
    a = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    f = pejit(lambda a, x: jnp.sin(a) @ x, constant_argnums=0)
    x = jnp.ones(shape[1])
    f(a, x)
    spec = f.specialize(a, x)
    assert isinstance(spec.call, functools.partial) is not compiled_in  # 16 KiB; 2 MiB stays a buffer
    with f32_products():
        np.testing.assert_allclose(f(a, x), jnp.sin(a) @ x, rtol=1e-5, atol=1e-5)
        b = a + 1.0  # a second value of the structure shares the program: no compile of its own
        np.testing.assert_allclose(f(b, x), jnp.sin(b) @ x, rtol=1e-5, atol=1e-5)
    assert isinstance(f.specialize(b, x).call, functools.partial)


# -- pytree constants that keep their value with their identity ---------------------
@dataclasses.dataclass(frozen=True)
class Model:
    weights: jax.Array
    table: np.ndarray  # a writable NumPy array: its contents can still change
    scale: float = 2.0


def test_a_frozen_pytree_is_recognized_by_identity_and_its_numpy_bytes():
    jax.tree_util.register_dataclass(Model, data_fields=["weights", "table"], meta_fields=["scale"])
    m = Model(jnp.ones((3, 3)), np.arange(3.0))
    assert _keys.frozen_parts(m) == [m.table] and _keys.frozen_parts({"w": m.weights}) is None
    f = pejit(lambda m, x: m.weights @ x * m.scale + m.table, constant_argnums=0)
    x = jnp.ones(3)
    for _ in range(2):  # (the second call memoizes, where work beside the first waits for it)
        np.testing.assert_allclose(f(m, x), [6.0, 7.0, 8.0])
    guard = call_path(f).caches.fast_path().last[0][-2]  # the memo's: the NumPy leaf's bytes, not the tree's key again
    assert not isinstance(guard, functools.partial) and guard.arrays == [m.table]
    m.table[0] = 10.0  # its NumPy leaf changes: never used stale
    np.testing.assert_allclose(f(m, x), [16.0, 7.0, 8.0])
