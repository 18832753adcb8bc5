"""Kernels of a fold run on a worker thread beside the rest of it (pejit._fold._offload)."""

from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive
from jax.interpreters import mlir

from pejit import FoldOptions, pe, pejit
from pejit import _compat
from pejit._fold import _abstract, _batch, _host, _offload
from pejit._fold._recipe import Recipe
from pejit._calls._program import FoldingProgram

from ._util import Compiles, cpu_devices, cpu_only

# A kernel as TFC's basis is one: a Python ``impl`` (which counts its calls)
# and a lowering of its own, here to XLA's ``exp``: the worker runs the
# lowering, JAX's eager dispatch the ``impl``. The values agree bit for bit.
impl_calls = []
kernel_p = Primitive("test_offload_kernel")
kernel_p.def_impl(lambda x: impl_calls.append(1) or jax.jit(jnp.exp)(x))
kernel_p.def_abstract_eval(lambda x: x)
mlir.register_lowering(kernel_p, mlir.lower_fun(jnp.exp, multiple_results=False))

#: 1 MiB of float32, the smallest output handed out
SIZE = 512
two_cores = pytest.mark.skipif(_offload._cores() < 2, reason="one core: nothing runs beside the fold")


def f(A, B, x):
    return kernel_p.bind(A) + kernel_p.bind(B) + x


def constants(n=2):
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.standard_normal((SIZE, SIZE)), jnp.float32) for _ in range(n)]


def expected(*args):
    """What JAX's eager mode computes: each ``exp`` on its own, then the sums."""
    *constants, x = args
    return sum(jax.jit(jnp.exp)(c) for c in constants) + x


@cpu_only  # the worker runs only beside the CPU back end
@two_cores
@pytest.mark.parametrize("form", ["pe", "pejit"])
def test_kernels_on_constants_run_compiled_beside_the_fold_with_the_eager_values(form):
    A, B = constants()
    x = jnp.ones(SIZE, jnp.float32)
    impl_calls.clear()
    g = pe(A, B, x, constant_arg_nums=[0, 1])(f) if form == "pe" else pejit(f, constant_argnums=(0, 1))
    out = g(x) if form == "pe" else g(A, B, x)
    assert impl_calls == []  # both kernels ran as compiled programs, not by the eager impl
    np.testing.assert_array_equal(out, expected(A, B, x))


@cpu_only  # the worker runs only beside the CPU back end
@two_cores
def test_beyond_the_budget_kernels_wait_to_be_handed_out(monkeypatch):
    monkeypatch.setattr(_offload, "AHEAD_BYTES", 1)  # one result waits at a time, per kind
    waiting = []
    hand = _offload.Kernels.hand

    def watched(self, *args, **kwargs):
        handed = hand(self, *args, **kwargs)
        waiting.append(dict(self._waiting))
        return handed

    monkeypatch.setattr(_offload.Kernels, "hand", watched)
    A, B, C = constants(3)
    x = jnp.ones(SIZE, jnp.float32)
    g = pe(A, B, C, x, constant_arg_nums=[0, 1, 2])(lambda A, B, C, x: f(A, B, x) + kernel_p.bind(C))
    np.testing.assert_array_equal(g(x), expected(A, B, x) + jax.jit(jnp.exp)(C))
    assert waiting and all(max(w.values()) <= SIZE * SIZE * 4 for w in waiting)


def test_on_one_core_the_batch_evaluates_kernels(monkeypatch):
    monkeypatch.setattr(_offload, "_cores", lambda: 1)
    A, B = constants()
    x = jnp.ones(SIZE, jnp.float32)
    impl_calls.clear()
    np.testing.assert_array_equal(pe(A, B, x, constant_arg_nums=[0, 1])(f)(x), expected(A, B, x))
    assert impl_calls == [1, 1]


def test_small_kernels_and_kernels_without_a_lowering_are_left_to_the_batch():
    small = Recipe(kernel_p, (np.ones((4, 4), np.float32),), {}, (_compat.new_var(jax.core.ShapedArray((4, 4), np.float32)),))
    kernels = _offload.Kernels()
    kernels.early(small)
    assert small not in kernels
    unlowered_p = Primitive("test_offload_unlowered")
    unlowered_p.def_impl(lambda x: x)
    unlowered_p.def_abstract_eval(lambda x: x)
    big = np.ones((SIZE, SIZE), np.float32)
    recipe = Recipe(unlowered_p, (big,), {}, (_compat.new_var(jax.core.ShapedArray(big.shape, big.dtype)),))
    assert not kernels.kernel(recipe)
    assert kernels.take(recipe, [big]) is None


# A kernel of a constant and a small grid, as TFC's basis is of its points.
grid_kernel_p = Primitive("test_offload_grid_kernel")
grid_kernel_p.def_impl(lambda a, g: jax.jit(lambda a, g: jnp.exp(a) + g)(a, g))
grid_kernel_p.def_abstract_eval(lambda a, g: a)
mlir.register_lowering(grid_kernel_p, mlir.lower_fun(lambda a, g: jnp.exp(a) + g, multiple_results=False))


@cpu_only  # the worker runs only beside the CPU back end
@two_cores
def test_a_small_numpy_input_of_kernels_is_put_on_the_device_once_per_fold(monkeypatch):
    """TFC's basis kernels read the same NumPy grids: each is put once, however
    many kernels read it and whether or not it is the same object."""
    puts = []
    to_jax = _host.to_jax

    def counting(a):
        if isinstance(a, np.ndarray) and a.shape == (SIZE,):
            puts.append(a)
        return to_jax(a)

    monkeypatch.setattr(_host, "to_jax", counting)
    A, B, C = constants(3)
    grid = np.linspace(0.0, 1.0, SIZE, dtype=np.float32)

    def g(A, B, C, grid, x):
        return (grid_kernel_p.bind(A, grid) + grid_kernel_p.bind(B, grid)
                + grid_kernel_p.bind(C, np.array(grid)) + x)

    x = jnp.ones(SIZE, jnp.float32)
    out = pe(A, B, C, grid, x, constant_arg_nums=[0, 1, 2, 3])(g)(x)
    np.testing.assert_allclose(out, sum(jnp.exp(c) + grid for c in (A, B, C)) + x, rtol=1e-6)
    assert len(puts) == 1


@cpu_only  # the worker runs only beside the CPU back end
@two_cores
def test_kernels_handed_out_by_the_trace_are_taken_once_or_let_go():
    (A,) = constants(1)
    var = _compat.new_var(jax.core.ShapedArray(A.shape, A.dtype))
    taken, dropped = Recipe(kernel_p, (A,), {}, (var,)), Recipe(kernel_p, (-A,), {}, (var,))
    kernels = _offload.Kernels()
    kernels.early(taken)
    kernels.early(dropped)
    assert taken in kernels and dropped in kernels
    np.testing.assert_array_equal(kernels.take(taken, [A]), jnp.exp(A))
    assert taken not in kernels
    kernels.close()  # the fold is over: what no batch took is let go
    assert dropped not in kernels


@cpu_only  # the worker runs only beside the CPU back end
@two_cores
def test_a_batch_takes_back_the_trace_s_unstarted_kernels_to_hand_them_out_in_its_order():
    A, B = constants()
    recipes = [Recipe(kernel_p, (c,), {}, (_compat.new_var(jax.core.ShapedArray(c.shape, c.dtype)),)) for c in (A, B)]
    kernels = _offload.Kernels()
    busy = threading.Event()
    _offload._pool().submit(busy.wait, 10)  # the worker starts nothing else meanwhile
    try:
        for r in recipes:
            kernels.early(r)
        assert all(r in kernels for r in recipes)
        ahead = _offload.Ahead(kernels, recipes[::-1], {})  # a batch that needs B first
        assert not any(r in kernels for r in recipes)
        ahead.submit(-1)
        assert all(r in kernels for r in recipes)
    finally:
        busy.set()
    for r, c in zip(recipes, (A, B)):
        np.testing.assert_array_equal(kernels.take(r, [c]), jax.jit(jnp.exp)(c))


def _call_eqn(fun, *args):
    """The one call equation of ``fun`` under ``jax.jit``: what a recipe of a ``jnp`` function binds."""
    (eqn,) = jax.make_jaxpr(lambda *a: jax.jit(fun)(*a))(*args).eqns
    return eqn


def test_only_what_a_batch_would_compile_alone_is_compiled_ahead():
    a = np.ones((3, 5), np.float32)
    sin, mul = _call_eqn(jnp.sin, a), _call_eqn(lambda a: a * 2, a)
    assert _offload._compiled_alone(sin.primitive, sin.params)  # no host rule gives XLA's bits
    assert not _offload._compiled_alone(mul.primitive, mul.params)  # NumPy computes it
    assert _offload._specs([a]) == ((a.shape, a.dtype),)
    assert _offload._specs([jnp.asarray(2.0)]) is None  # weakly typed: the kernel's result would not be
    assert _offload._specs([jnp.ones(3, jnp.bfloat16)]) is None  # a dtype the host does not know
    assert _offload._specs([_compat.new_var(jax.core.ShapedArray((2,), np.float32))]) is None
    assert _offload._specs([_compat.new_var(jax.core.ShapedArray((2,), np.float32))], abstract=True) is not None


def _drain_before(monkeypatch, module, name):
    """Have ``module.name`` wait until the worker has done what was handed to it:
    whether the worker or the folding thread gets to a program first is a race."""
    function = getattr(module, name)

    def drained(*args, **kwargs):
        _offload._pool().submit(lambda: None).result()
        return function(*args, **kwargs)

    monkeypatch.setattr(module, name, drained)


@cpu_only  # the worker runs only beside the CPU back end
@two_cores
@pytest.mark.parametrize("form", ["pejit", "pe"])
def test_while_traced_the_worker_compiles_what_the_batch_runs(monkeypatch, form):
    compiled_on, evaluated = [], []
    compile_, bind_known = jax.stages.Lowered.compile, _abstract.bind_known

    def compile_watched(self, *args, **kwargs):
        if "sine" in self.as_text():  # sin, cos
            compiled_on.append(threading.current_thread().name)
        return compile_(self, *args, **kwargs)

    def bind_watched(prim, args, params, *outer):
        evaluated.append(str(params.get("jaxpr", prim.name)))  # a call: its body
        return bind_known(prim, args, params, *outer)

    monkeypatch.setattr(jax.stages.Lowered, "compile", compile_watched)
    monkeypatch.setattr(_abstract, "bind_known", bind_watched)
    _drain_before(monkeypatch, _batch, "run_batch")
    _batch.clear_programs()

    def f(A, x):
        for _ in range(3):
            A = jnp.cos(jnp.sin(A) * 1.5 + 0.5)
        return A + x

    A = np.random.default_rng(0).standard_normal((17, 23)).astype(np.float32)
    x = np.float32(1.0)
    # (small: else compiled in; its fold on the caller's thread, not beside its first call)
    folded = pejit(f, constant_argnums=0, fold_options=FoldOptions(min_gain=0.0, beside=False))
    out = folded(A, x) if form == "pejit" else pe(A, x, constant_arg_nums=[0])(f)(x)
    if form == "pejit":
        # a folding program's first value of few equations of four kinds is one compiled
        # program (_cost.one_program_pays), known before its trace: no kernel warms for it
        np.testing.assert_allclose(out, f(jnp.asarray(A), x), rtol=1e-6)
        assert compiled_on == ["MainThread"]
    else:
        np.testing.assert_array_equal(out, f(jnp.asarray(A), x))  # JAX's eager values, bit for bit
        assert compiled_on == ["pejit-kernels_0"] * 2  # sin and cos, each once, on the worker
        assert not [e for e in evaluated if "sin" in e or "cos" in e]  # not compiled again by JAX's eager dispatch


@two_cores
@pytest.mark.parametrize("rows, compiled_in", [(48, True), (16384, False)], ids=["small", "large"])
def test_the_first_value_compiles_one_residual(monkeypatch, rows, compiled_in):
    # Large folded constants: the shared residual compiles on the worker while the first
    # value is evaluated, and serves the call. Small ones are compiled into the first
    # value's program (Specialization.compile_in), which its first call compiles: the
    # shared one is not compiled ahead to compete with it.
    _drain_before(monkeypatch, FoldingProgram, "first_value")

    def spread(A, x):  # the residual's HLO module is named after it
        return jnp.sin(A) @ x

    A = np.random.default_rng(1).standard_normal((rows, 40)).astype(np.float32)
    A.setflags(write=False)  # recognized by identity: no digest per call
    x = np.ones(40, np.float32)
    g = pejit(spread, constant_argnums=0, fold_options=FoldOptions(beside=False))  # the first call folds
    with Compiles() as compiles:
        out = g(A, x)
        g(A, x)
        _offload.submit(lambda: None).result()  # the worker's queue drained
        np.testing.assert_allclose(g(A, x), out)
    np.testing.assert_allclose(out, spread(A, x), rtol=1e-6)
    if not any(name for name, _ in compiles.where):
        pytest.skip("this JAX does not name the programs it compiles")
    assert isinstance(g.specialize(A, x).call, functools.partial) is not compiled_in
    residual = [thread for name, thread in compiles.where if "spread" in name]
    assert residual == ["MainThread" if compiled_in else "pejit-kernels_0"]


@cpu_devices("equal constants are found by their bytes in host memory")
def test_a_first_value_with_equal_constants_gets_a_residual_of_its_own():
    f = lambda A, B, x: jnp.sin(A) @ x + jnp.sin(B) @ x  # noqa: E731
    A = np.random.default_rng(2).standard_normal((8, 8)).astype(np.float32)
    g = pejit(f, constant_argnums=(0, 1))
    x = np.ones(8, np.float32)
    np.testing.assert_allclose(g(A, A.copy(), x), f(A, A, x), rtol=1e-6)  # the folded sines are one constant
    assert len(g.specialize(A, A.copy(), x).consts) == 1
    np.testing.assert_allclose(g(A, -A, x), f(A, -A, x), rtol=1e-6)


@cpu_only  # the worker runs only beside the CPU back end
@two_cores
def test_a_program_that_fails_to_compile_ahead_is_left_to_the_batch(monkeypatch):
    a = np.ones((3, 7), np.float32)
    sin = _call_eqn(jnp.sin, a)
    var = _compat.new_var(jax.core.ShapedArray(a.shape, a.dtype))
    recipe = Recipe(sin.primitive, (var,), sin.params, (_compat.new_var(jax.core.ShapedArray(a.shape, a.dtype)),))
    _batch.clear_programs()
    kernel = _offload._lowered(recipe, _offload._specs([a]))
    monkeypatch.setattr(kernel, "_lowered", None)  # compiling raises
    kernel.ahead = True
    assert _offload.Kernels().take(recipe, [a]) is None  # the batch evaluates it
    assert _offload._warmed(recipe, [a]) is None  # and asks no more


def test_the_answer_for_a_call_body_does_not_keep_it_alive():
    import gc
    import weakref

    # a copy of the body, which JAX's own caches do not hold
    body = _call_eqn(lambda a: jnp.sin(a) + 1.0, np.ones(5, np.float32)).params["jaxpr"].jaxpr.replace()
    assert _offload._body_alone(body)  # sin: no host rule
    dead = weakref.ref(body)
    del body
    gc.collect()
    assert dead() is None


@cpu_only  # the worker runs only beside the CPU back end
@two_cores
@pytest.mark.parametrize("kind", ["jax.Array", "NumPy"])
def test_the_call_time_form_starts_kernels_on_constants_while_its_folding_program_is_traced(monkeypatch, kind):
    """As the TFC form's concrete trace does: TFC's basis on its grid starts
    on the worker beside the trace, and the first value's batch takes each
    result where an equation computes the same, instead of computing it."""
    handed = []
    first_value = FoldingProgram.first_value

    def watched(self, *arrays, kernels=None, **kwargs):
        _offload._pool().submit(lambda: None).result()  # what the trace handed out is done
        handed.append(len(kernels._by_inputs))
        return first_value(self, *arrays, kernels=kernels, **kwargs)

    monkeypatch.setattr(FoldingProgram, "first_value", watched)
    ran_on = []
    call = _offload._Kernel.__call__

    def run_watched(self, args):
        if "exponential" in self._lowered.as_text():
            ran_on.append(threading.current_thread().name)
        return call(self, args)

    monkeypatch.setattr(_offload._Kernel, "__call__", run_watched)

    def as_kind(c):
        if kind == "jax.Array":
            return jnp.asarray(c)
        c = np.array(c)
        c.setflags(write=False)  # known by identity, as a jax.Array is
        return c

    A, B = map(as_kind, constants())
    x = jnp.ones(SIZE, jnp.float32)
    impl_calls.clear()
    g = pejit(f, constant_argnums=(0, 1))
    np.testing.assert_array_equal(g(A, B, x), expected(A, B, x))
    assert handed == [2]  # both kernels, while traced
    assert ran_on == ["pejit-kernels_0"] * 2 and impl_calls == []  # each once, on the worker, none again
    spec = g.specialize(A, B, x)
    assert spec.program.folding_program is not None and g.report(A, B, x).fallbacks == ()
    A2, B2 = as_kind(-A), as_kind(B + 1)  # another value: the folding program's, compiled
    np.testing.assert_allclose(g(A2, B2, x), expected(A2, B2, x), rtol=1e-6)
