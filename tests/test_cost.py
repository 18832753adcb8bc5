"""The cost model (``pejit._fold._cost``): one measure per equation, and each decision
on small programs built to sit on either side of its line. Decisions, never times."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pejit._compat import open_jaxpr
from pejit._fold import _cost, _device, _known
from pejit._fold._cost import Cost
from pejit._residual._collapse import collapse, collapsible


def jaxpr(fun, *args):
    return jax.make_jaxpr(fun)(*args)


# -- the measure ----------------------------------------------------------------------
def test_a_product_costs_its_flops_its_operands_and_a_kernel():
    cost = _cost.jaxpr_cost(jaxpr(lambda a, b: a @ b, jnp.ones((8, 16)), jnp.ones((16, 4))))
    assert cost == Cost(flops=2 * 8 * 4 * 16, bytes=4 * (8 * 16 + 16 * 4), kernels=1.0, library=0.0)


def test_fused_elementwise_work_reads_its_input_once():
    chain = _cost.jaxpr_cost(jaxpr(lambda x: jnp.exp(jnp.sin(jnp.cos(x))), jnp.ones(1000)))
    assert chain.flops == 3000 and chain.bytes == 4000 and chain.kernels == 0
    # a product cannot fuse its operand's producer: it reads it from memory
    product = _cost.jaxpr_cost(jaxpr(lambda x, m: m @ jnp.sin(x), jnp.ones(100), jnp.ones((10, 100))))
    assert product.bytes == 400 + (4000 + 400)


def test_a_library_call_runs_on_every_trip_of_a_loop():
    inv = _cost.jaxpr_cost(jaxpr(jnp.linalg.inv, jnp.eye(4)))
    assert inv.library >= 2 and inv.kernels >= inv.library
    per_call = inv.invariant(10)
    assert per_call.flops == inv.flops and per_call.library == 10 * inv.library
    assert per_call.seconds() > inv.seconds()
    assert Cost(flops=1.0).invariant(10) == Cost(flops=1.0)  # arithmetic: XLA computes it once


def test_a_scan_costs_its_body_each_trip():
    body = _cost.jaxpr_cost(jaxpr(lambda c, x: jnp.sin(c) * x, jnp.ones(8), jnp.ones(8)))
    scan = _cost.jaxpr_cost(jaxpr(lambda c, xs: lax.scan(lambda c, x: (jnp.sin(c) * x, None), c, xs)[0],
                                  jnp.ones(8), jnp.ones((5, 8))))
    assert scan.flops == 5 * body.flops


def test_seconds_weigh_by_the_device():
    cost = Cost(flops=1e6, kernels=1.0)
    assert cost.seconds(_device.CPU) == 1e6 / _device.CPU.flops_per_second + _device.CPU.kernel_seconds
    assert cost.seconds(_device.GPU) < cost.seconds(_device.CPU)
    with _device.using(_device.GPU):
        assert cost.seconds() == cost.seconds(_device.GPU)


# -- per call --------------------------------------------------------------------------
def test_a_fold_pays_when_it_saves_enough_of_the_call():
    assert _cost.fold_pays(Cost(flops=6e5), Cost(flops=1e7), min_gain=0.05)
    assert not _cost.fold_pays(Cost(flops=4e5), Cost(flops=1e7), min_gain=0.05)
    assert _cost.fold_pays(Cost(flops=1.0), Cost(flops=1e7), min_gain=0.0)


def test_a_fold_that_saves_nothing_never_pays():
    # it would only store what the program makes as cheaply (jnp.ones(n) fed to a sparse product)
    assert not _cost.fold_pays(_cost.ZERO, _cost.ZERO, min_gain=0.0)
    assert not _cost.fold_pays(_cost.ZERO, Cost(flops=1e6), min_gain=0.0)


def test_an_expansion_stays_lazy_when_it_grows_its_input():
    assert _cost.stays_lazy(in_bytes=4, out_bytes=4096, ratio=2.0, min_bytes=1024)
    assert not _cost.stays_lazy(in_bytes=4, out_bytes=1024, ratio=2.0, min_bytes=1024)  # small: stored
    assert not _cost.stays_lazy(in_bytes=4096, out_bytes=8192, ratio=2.0, min_bytes=1024)  # 2x: stored


def test_tiny_known_results_are_computed_on_the_spot():
    assert _cost.on_the_spot(_cost.ON_THE_SPOT_BYTES)
    assert not _cost.on_the_spot(_cost.ON_THE_SPOT_BYTES + 1)


def test_a_collapse_pays_when_its_matrices_cost_less_than_the_region():
    before = Cost(flops=1e6, kernels=3.0)
    after, stored = _cost.matrix_cost(n_out=100, n_in=100, offset=False, itemsize=4)
    assert stored == 4e4 and after.kernels == 1.0
    assert _cost.collapse_pays(before, after)
    assert not _cost.collapse_pays(after, after)  # no better: not worth building


def test_no_region_collapses_in_a_program_that_costs_less_than_one_matrix_kernel():
    a, m = jnp.ones((3, 5)), jnp.ones((4, 4))
    programs = {  # (program, its arguments, how many lead and are known, whether a region collapses)
        "outer": (lambda a, x: jnp.outer(a[0], x[1]), (a, a), 1, False),
        "exp": (lambda a, x: (jnp.exp(a), jnp.exp(x)), (a, a), 1, False),
        "tri": (lambda a, x: jnp.tri(3, a.shape[1]) * a + x, (a, a), 1, False),
        "A(Bx)": (lambda a, b, x: a @ (b @ x), (m, m, jnp.ones(4)), 2, True),
    }
    for name, (fun, args, n, collapses) in programs.items():
        program, _ = open_jaxpr(jaxpr(fun, *args))
        # sound: where it says none could, the pass (which does not ask it) collapses none
        _, _, collapsed = collapse(program, args[:n], 1 << 20)
        assert bool(collapsed) == collapses, name
        assert _cost.collapse_can_pay(_cost.jaxpr_cost(program)) == collapses, name
        assert collapsible(program, n, 1 << 20) == collapses, name
    assert _cost.collapse_can_pay(Cost(kernels=1.01 / _cost.COLLAPSE_PAYS))
    assert not _cost.collapse_can_pay(Cost(kernels=0.99 / _cost.COLLAPSE_PAYS))


def test_small_constants_are_compiled_in():
    assert _cost.compiled_in(_cost.INLINE_BYTES)
    assert not _cost.compiled_in(_cost.INLINE_BYTES + 1)


def test_promotion_needs_the_fold_to_remove_the_threshold():
    assert _cost.promotion_pays(2e6, _cost.PROMOTION_MIN_FLOPS)
    assert not _cost.promotion_pays(1e6, _cost.PROMOTION_MIN_FLOPS)
    assert _cost.promotion_pays(0.0, 0.0)  # auto_min_flops=0 promotes whatever repeats


# -- once: how the fold evaluates ---------------------------------------------------------
def test_a_run_compiles_when_fusing_saves_more_than_the_compile():
    assert not _cost.run_compiles(equations=3, traffic=0, alike=1)  # three dispatches: op by op
    assert _cost.run_compiles(equations=3, traffic=0, alike=1000)  # an unrolled loop's steps share it
    assert _cost.run_compiles(equations=3, traffic=256 * 2**20, alike=1)  # 256 MiB of intermediates


def test_one_program_pays_for_many_distinct_operations():
    ridge = jaxpr(lambda X, lam: jnp.linalg.cholesky(X.T @ X + lam * jnp.eye(X.shape[1])), jnp.ones((50, 10)), 1.0)
    chain = jaxpr(lambda x: jnp.sin(jnp.sin(jnp.sin(jnp.sin(x)))), jnp.ones(10))
    assert _cost.one_program_pays(ridge.jaxpr.eqns)
    assert not _cost.one_program_pays(chain.jaxpr.eqns)  # one distinct operation



def test_a_collapse_build_runs_op_by_op_where_few_operations_repeat():
    short = jaxpr(lambda x: jnp.sin(x) * 2.0, jnp.ones(4)).jaxpr.eqns  # a ridge loss's solve: one program
    repeats = jaxpr(lambda x: sum(jnp.sin(x * i) for i in range(100)), jnp.ones(4)).jaxpr.eqns  # a TFC operator
    assert _cost.build_compiles(short) and not _cost.build_compiles(repeats)


# -- before anything is evaluated ------------------------------------------------------------
def test_known_work_is_what_depends_on_known_inputs_alone():
    closed = jaxpr(lambda A, x: jnp.linalg.inv(A) @ x, jnp.eye(64), jnp.ones(64))
    folded = _known.known_work(closed, [True, False])
    assert folded.pays(0.05) and folded.saved.library >= 2
    assert "dot_general" not in {e.primitive.name for e in folded.folded}
    assert not _known.known_work(closed, [False, True]).pays(0.05)


def test_a_cheap_expansion_saves_nothing():
    # the residual computes jnp.ones(n) * c as XLA would; storing it would not pay
    closed = jaxpr(lambda c, x: jnp.ones(100_000) * c + x, 2.0, jnp.ones(100_000))
    work = _known.known_work(closed, [True, False])
    assert {e.primitive.name for e in work.folded} == {"convert_element_type"}  # the scalar alone
    assert work.saved.flops == 0 and not work.pays(0.05)


def test_a_small_known_part_of_a_large_call_does_not_pay():
    closed = jaxpr(lambda a, x: jnp.tanh(x @ x) + jnp.sum(a * a) * x, jnp.ones((16, 16)), jnp.ones((512, 512)))
    work = _known.known_work(closed, [True, False])
    assert work.saved.flops > 0 and not work.pays(0.05) and work.pays(0.0)


def test_effects_are_not_known_work():
    def f(a, x):
        jax.debug.print("{}", jnp.sum(jnp.linalg.inv(a)))
        return x

    closed = jaxpr(f, jnp.eye(8), 1.0)
    assert "debug_callback" not in {e.primitive.name for e in _known.known_work(closed, [True, False]).folded}


def test_known_work_in_a_loop_body_is_hoisted_once():
    def f(a, x):
        return lax.fori_loop(0, 20, lambda i, v: jnp.linalg.inv(a) @ v, x)

    closed = jaxpr(f, jnp.eye(8), jnp.ones(8))
    work = _known.known_work(closed, [True, False])
    inv = _cost.jaxpr_cost(jaxpr(jnp.linalg.inv, jnp.eye(8)))
    assert work.saved.library == 20 * inv.library  # a library call would run on each of 20 trips
    assert work.saved.flops == inv.flops + 20  # its arithmetic once (XLA hoists it); the counter's add each trip


def test_known_carries_save_their_work_on_every_trip():
    def f(a, x):  # the counter is known on every trip: a + i, and its factorization, are too
        return lax.fori_loop(0, 4, lambda i, v: jnp.linalg.solve(a + i, v), x)

    work = _known.known_work(jaxpr(f, jnp.eye(4), jnp.ones(4)), [True, False])
    lu = _cost.jaxpr_cost(jaxpr(lambda a: jax.lax.linalg.lu(a)[0], jnp.eye(4)))
    assert work.saved.flops >= 4 * lu.flops


def test_reassociated_products_in_a_loop_body_save_a_product_each_trip():
    c, d = jnp.ones((8, 64)), jnp.ones((64, 8))

    def f(cd, x):
        return lax.fori_loop(0, 10, lambda i, v: jnp.tanh(cd[0] @ (cd[1] @ v)), x)

    work = _known.known_work(jaxpr(f, (c, d), jnp.ones(8)), [True, True, False])
    assert work.saved.kernels == 10  # one product fewer on each of 10 trips
    assert work.saved.flops >= 10 * 2 * (8 * 64 + 64 * 8 - 8 * 8)


def test_a_nested_call_is_looked_into():
    inner = jax.jit(lambda a, x: jnp.linalg.cholesky(a @ a.T) @ x)
    closed = jaxpr(lambda a, x: inner(a, x) + 1.0, np.eye(32, dtype=np.float32), jnp.ones(32))
    work = _known.known_work(closed, [True, False])
    assert {"transpose", "dot_general", "jit"} <= {e.primitive.name for e in work.folded}  # jit(cholesky) whole
    assert work.saved.library == 1 and work.pays(0.05)


def test_a_loop_whose_trip_count_the_constants_decide_must_fold(monkeypatch):
    # fori_loop's bounds constant, its body on the dynamic value: the fold makes it a loop
    # of known length (as fori_loop makes one of concrete bounds a scan, which grad needs)
    fori = jaxpr(lambda n, x: lax.fori_loop(0, n, lambda i, c: c * 2.0, x), 3, 1.0)
    assert [e.primitive.name for e in _known.known_work(fori, [True, False]).needed] == ["while"]
    assert not _known.known_work(fori, [False, True]).needed
    from pejit import _compat

    traced = []
    real = _compat.partial_eval_jaxpr_nounits_fwd
    monkeypatch.setattr(_compat, "partial_eval_jaxpr_nounits_fwd", lambda *a, **k: traced.append(a) or real(*a, **k))
    # a condition on the dynamic value from the first trip (a solver's convergence test):
    # read off the condition, without tracing the body again
    until = jaxpr(lambda c, x: lax.while_loop(lambda v: v < c, lambda v: v * 2.0, x), 10.0, 1.0)
    assert not _known.known_work(until, [True, False]).needed and not traced
    # known on the first trip, unknown after it: the body's partial evaluation tells
    later = jaxpr(lambda c, x: lax.while_loop(lambda v: v[0] < c, lambda v: (v[0] + v[1], v[1]), (0.0, x))[0],
                  10.0, 1.0)
    assert not _known.known_work(later, [True, False]).needed and traced


def test_a_pad_of_a_known_operand_by_an_unknown_value_must_fold():
    # JAX cannot transpose it with the operand known (rules.transposable restages it):
    # a program that holds one is folded, whatever folding it saves
    pad = jax.make_jaxpr(lambda c, v: lax.pad(c, v, [(1, 1, 0)]))(jnp.ones(3), 0.0)
    work = _known.known_work(pad, [True, False])
    assert [e.primitive.name for e in work.needed] == ["pad"] and work.pays(0.05)
    assert not _known.known_work(pad, [False, True]).needed  # the operand unknown: JAX transposes it
    literal = jax.make_jaxpr(lambda c: lax.pad(c, 0.0, [(1, 1, 0)]))(jnp.ones(3))
    assert not _known.known_work(literal, [True]).needed
    of_literal = jax.make_jaxpr(lambda v: lax.pad(jnp.float32(2), v, []))(1.0)  # a literal operand is known
    assert [e.primitive.name for e in _known.known_work(of_literal, [False]).needed] == ["pad"]
