"""What folding costs beyond its arithmetic and its compiles (issue 24).

Structural, never timed: calls into JAX's per-value machinery are counted
with patches, and the count must not grow with the number of folded values;
memory is checked by what is still referenced, not by RSS.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pejit as pejit_module
from pejit import pejit
from pejit import _compat
from pejit._fold import _host
from pejit._fold._staging import trace_staging

from ._util import Compiles, cpu_devices, cpu_only, with_f32_products


def many_constants(a, x, k):
    """``k`` folded constants, each read by the residual (``x`` is dynamic)."""
    return sum(jnp.sin(a + float(i)) @ x for i in range(k))


PEJIT_SOURCE = os.path.dirname(pejit_module.__file__)


class Counting:
    """Counts calls to ``jax.block_until_ready`` and to ``Tracer.__getattr__``.

    ``getattrs`` lists every lookup, ``ours`` those that pejit's own code
    made (JAX's tracing probes attributes on its own, e.g. ``__jax_array__``
    in ``jnp`` functions, as it does under ``jax.jit``).
    """

    def __init__(self, monkeypatch):
        self.blocks = 0
        self.getattrs: list[str] = []
        self.ours: list[str] = []
        block, getattr_ = jax.block_until_ready, _compat.Tracer.__getattr__

        def counting_block(x):
            self.blocks += 1
            return block(x)

        def counting_getattr(tracer, name):
            self.getattrs.append(name)
            if sys._getframe(1).f_code.co_filename.startswith(PEJIT_SOURCE):
                self.ours.append(name)
            return getattr_(tracer, name)

        monkeypatch.setattr(jax, "block_until_ready", counting_block)
        monkeypatch.setattr(_compat.Tracer, "__getattr__", counting_getattr)


@pytest.mark.parametrize("form", ["call-time", "tfc"])
@with_f32_products  # the values against jax.jit's: on GPUs, TF32 products round apart
def test_no_per_value_overhead(monkeypatch, form):
    """Neither blocking nor tracer attribute lookups grow with the folded values.

    The call-time form folds under ``jax.jit`` (a folding program), where the
    folded values are tracers: asking one for ``block_until_ready`` goes
    through JAX's error-message machinery (tens of milliseconds each).
    """
    a, x = np.eye(3, dtype=np.float32), np.ones(3, np.float32)
    counts = {}
    for k in (4, 24):
        c = Counting(monkeypatch)
        fun = lambda a, x: many_constants(a, x, k)  # noqa: E731
        if form == "call-time":
            out = pejit(fun, constant_argnums=0)(a, x)
        else:
            out = pejit(a, x, constant_arg_nums=[0])(fun)(x)
        np.testing.assert_allclose(out, jax.jit(fun)(a, x), rtol=1e-5)
        counts[k] = (c.blocks, c.ours)
        assert "block_until_ready" not in c.getattrs
        monkeypatch.undo()
    assert counts[24] == counts[4] and counts[4][0] <= 1 and not counts[4][1], counts


def test_specialize_again_no_per_value_overhead(monkeypatch):
    """A second constant value runs the folding program: no per-value overhead either."""
    f = pejit(lambda a, x: many_constants(a, x, 24), constant_argnums=0)
    a, x = np.eye(3, dtype=np.float32), np.ones(3, np.float32)
    f(a, x)
    c = Counting(monkeypatch)
    f(jnp.asarray(2 * a), x)
    assert c.blocks <= 1 and not c.ours and "block_until_ready" not in c.getattrs


# -- memory: the largest live set, not the sum ---------------------------------
def probe_primitive(log: list):
    """``x + 1`` (no lowering: always evaluated op by op) that logs, per call,
    how many of its earlier outputs are still alive."""
    import weakref

    from jax.extend.core import Primitive

    probe_p = Primitive("fold_cost_probe")
    outputs: list = []

    def impl(x):
        log.append(sum(r() is not None for r in outputs))
        y = jnp.asarray(x) + 1
        outputs.append(weakref.ref(y))
        return y

    probe_p.def_impl(impl)
    probe_p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    return probe_p


@pytest.mark.parametrize("form", ["call-time", "tfc"])
def test_intermediates_die_after_their_last_use(form):
    """A chain of folded values keeps one or two alive, not the whole chain."""
    log: list = []
    probe_p = probe_primitive(log)

    def f(a, x):
        for _ in range(12):
            a = probe_p.bind(a)
        return a * x

    a, x = np.zeros(1000, np.float32), np.float32(2.0)
    if form == "call-time":
        out = pejit(f, constant_argnums=0)(a, x)
    else:
        out = pejit(a, x, constant_arg_nums=[0])(f)(x)
    np.testing.assert_allclose(out, 24.0)
    assert len(log) == 12 and max(log) <= 2, log


@cpu_devices("uniform and equal values are found by their bytes in host memory")
def test_kept_values_are_compact():
    """Values kept between batches: uniform ones cost no memory, equal ones are kept once."""
    from pejit import FoldOptions
    from pejit._fold._folding import Folder

    a = jnp.asarray(np.arange(4096, dtype=np.float32))

    def f(x):
        # four different folds each (the same fold twice is folded once)
        zeros = [(a + float(i)) * 0.0 for i in range(4)]  # uniform
        sines = [jnp.sin(a), jnp.sin(a * 1.0), jnp.sin(a + 0.0), jnp.sin(a - 0.0)]  # equal
        ys = [v * x for v in zeros + sines]  # each is used outside the next batch
        assert float(sum(z[0] for z in zeros) + sum(s[1] for s in sines)) > 0  # Python asks: a batch
        return sum(ys)

    folder = Folder(FoldOptions())
    trace_staging(lambda x: [f(x)], [jax.core.ShapedArray((), jnp.float32)], folder)
    kept = [v for v in folder.store.computed.values() if np.size(v) == 4096]
    uniform = [v for v in kept if isinstance(v, np.ndarray) and v.strides == (0,)]
    others = {id(v) for v in kept if not isinstance(v, np.ndarray)}
    assert len(uniform) >= 4 and len(others) == 1, (len(uniform), len(others))


# -- visibility: stage timings and progress ---------------------------------------
def test_stages_are_logged(caplog):
    import logging

    a, x = np.eye(8, dtype=np.float32), np.ones(8, np.float32)
    with caplog.at_level(logging.DEBUG, logger="pejit"):
        pejit(lambda a, x: many_constants(a, x, 3), constant_argnums=0)(a, x)
        pejit(a, x, constant_arg_nums=[0])(lambda a, x: many_constants(a, x, 3))(x)
    messages = [r.getMessage() for r in caplog.records if r.name == "pejit"]
    for stage in ("trace ", "fold ", "trace and fold ", "batch of "):
        assert any(stage in m for m in messages), (stage, messages)


@pytest.mark.parametrize("how", ["option", "environment"])
def test_progress_without_tqdm_prints_lines(monkeypatch, capsys, how):
    import sys

    from pejit import FoldOptions
    from pejit._fold import _progress

    monkeypatch.setitem(sys.modules, "tqdm", None)  # not installed
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    options = FoldOptions(progress=True) if how == "option" else FoldOptions()
    if how == "environment":
        monkeypatch.setenv(_progress.ENV, "1")
    a, x = np.eye(8, dtype=np.float32), np.ones(8, np.float32)
    pejit(a, x, constant_arg_nums=[0], fold_options=options)(lambda a, x: many_constants(a, x, 3))(x)
    err = capsys.readouterr().err
    assert "trace and fold" in err and "batch of" in err


def test_progress_bar(monkeypatch):
    tqdm = pytest.importorskip("tqdm.auto")
    from pejit import FoldOptions

    bars = []
    real = tqdm.tqdm

    def recording(*args, **kwargs):
        bars.append(real(*args, **kwargs))
        return bars[-1]

    monkeypatch.setattr(tqdm, "tqdm", recording)
    a, x = np.eye(8, dtype=np.float32), np.ones(8, np.float32)
    pejit(lambda a, x: many_constants(a, x, 3), constant_argnums=0, fold_options=FoldOptions(progress=True))(a, x)
    assert len(bars) == 1 and bars[0].n == bars[0].total > 0


@cpu_only  # the host rules compute these values; off the CPU, the device does
def test_each_tiny_value_computed_while_tracing_is_put_on_the_device_once(monkeypatch):
    """Scalars that the trace computes on the spot become ``jax.Array``s once per value
    (TFC's WaveEquation2D made 687 of them, most of them zeros and ones)."""
    puts = []
    to_jax = _host.to_jax

    def counting(a):
        if isinstance(a, (np.ndarray, np.generic)):
            puts.append((np.shape(a), a.dtype, a.tobytes()))
        return to_jax(a)

    monkeypatch.setattr(_host, "to_jax", counting)

    def h(c, x):
        for i in range(1, 21):
            x = x + (c[0] * 0.0 + c[1]) * (i % 2)
        return x

    c, x = jnp.array([2.0, 3.0]), jnp.ones(3)
    # folded before the call returns, not left to XLA with c compiled in (nor folded beside the call)
    options = pejit_module.FoldOptions(min_gain=0, beside=False)
    out = pejit(c, x, constant_arg_nums=[0], fold_options=options)(h)(x)
    np.testing.assert_array_equal(out, jax.jit(h)(c, x))
    assert puts and len(puts) == len(set(puts))  # 140 puts of 5 values before


@with_f32_products  # the values against float64 NumPy
def test_the_same_known_work_is_folded_once():
    """Known work met twice on the same inputs (TFC's derivatives evaluate each
    basis derivative several times) is evaluated once, as XLA's CSE would."""
    from jax.extend.core import Primitive

    calls = []
    basis_p = Primitive("test_basis")
    basis_p.def_impl(lambda x, *, order: calls.append(order) or jnp.sin(x) * order)
    basis_p.def_abstract_eval(lambda x, *, order: jax.core.ShapedArray(x.shape, x.dtype))

    def f(grid, coef):
        h = lambda order: basis_p.bind(grid, order=order)  # noqa: E731
        return h(1) @ coef + h(2) @ coef + h(1) @ (2 * coef) + jnp.sum(h(1)) * coef

    grid, coef = jnp.linspace(0.0, 1.0, 64).reshape(8, 8), jnp.arange(8.0)  # above TINY_BYTES: deferred
    g = pejit(*(grid, coef), constant_arg_nums=[0])(f)  # the TFC form: concrete constants
    want = np.sin(np.float64(grid))
    np.testing.assert_allclose(g(coef), want @ coef + 2 * want @ coef + want @ (2 * coef) + want.sum() * coef,
                               rtol=1e-5)
    assert sorted(calls) == [1, 2]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_while_folding_and_restored(enabled):
    import gc

    seen = []

    def f(c, x):
        seen.append(gc.isenabled())  # traced: runs while the fold does
        return jnp.sin(c) @ x

    c, x = jnp.ones((4, 4)), jnp.arange(4.0)
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        calltime = pejit(f, constant_argnums=0)
        np.testing.assert_allclose(calltime(c, x), jnp.sin(c) @ x, rtol=1e-6)
        tfc_form = pejit(c, x, constant_arg_nums=[0])(f)
        np.testing.assert_allclose(tfc_form(x), jnp.sin(c) @ x, rtol=1e-6)
        assert seen == [False, False]  # one trace per form
        closed = jax.make_jaxpr(lambda c, x: jnp.sin(c) @ x)(c, x)
        spec = pejit_module.specialize_jaxpr(closed, {0: c})
        assert [e.primitive.name for e in spec.jaxpr.eqns] == ["dot_general"]
        assert gc.isenabled() is enabled  # as it was, however the fold ended
        with pytest.raises(TypeError):
            pejit(lambda c, x: c @ x, constant_argnums=0)(c, jnp.ones(3))
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_a_batch_logs_what_it_wrote_and_what_it_kept(caplog):
    """A chain of elementwise work on a constant writes every intermediate
    but keeps one array: the log line says both (issue 35's measure of what
    materializing costs)."""
    import logging
    import re

    a, x = np.ones((64, 64), np.float32), np.ones(64, np.float32)

    def chain(a, x):
        for k in range(6):
            a = jnp.sin(a) * (k + 1.0)
        return a @ x

    with caplog.at_level(logging.DEBUG, logger="pejit"):
        # folded before the call returns, not left to XLA (nor folded beside the call)
        options = pejit_module.FoldOptions(backend="eager", min_gain=0, beside=False)
        pejit(a, x, constant_arg_nums=[0], fold_options=options)(chain)(x)
    lines = [r.getMessage() for r in caplog.records if "batch of" in r.getMessage()]
    written, kept = map(float, re.search(r"([\d.]+) MiB written, ([\d.]+) MiB kept", lines[-1]).groups())
    one = 64 * 64 * 4 / 2**20
    assert kept == pytest.approx(one, abs=0.05) and written >= 10 * one


@with_f32_products  # the values against jax.jit's: on GPUs, TF32 products round apart
def test_jacfwd_does_not_evaluate_its_jacobian_mid_trace():
    """``jax.jacfwd`` converts its Jacobian to the input's type, asking JAX's
    ``is_concrete`` first: answering by evaluating it ran a batch mid-trace
    that kept every value the residual would read, then recomputed the ones
    it dropped (TFC's PDE: 3.8 GB kept, 1119 equations twice). It is one batch."""
    rng = np.random.default_rng(0)
    H, xi = rng.standard_normal((40, 12)), rng.standard_normal(12)

    def step(xi, H):
        L = lambda xi: jnp.tanh(H) @ xi + jnp.cos(H) @ xi  # noqa: E731
        return xi - jnp.linalg.lstsq(jax.jacfwd(L)(xi), L(xi))[0]

    f = pejit(step, constant_argnums=1)
    report = f.specialize(xi, H).report
    assert [b.batch for b in report.batches] == [0] * len(report.batches)
    np.testing.assert_allclose(f(xi, H), jax.jit(step)(xi, H), rtol=1e-4, atol=1e-5)


def test_a_hi_primitive_folded_eagerly_compiles_one_program():
    """JAX 0.12's ``jnp.nonzero(..., size=n)`` is a ``call_hi_primitive``: bound eagerly,
    its lowering runs op by op (18 compiles the first time); folded, one program."""
    from pejit._fold import _abstract

    mask = np.array([True, False, True, True, False, True])
    eqns = jax.make_jaxpr(lambda m: jnp.nonzero(m, size=3))(mask).jaxpr.eqns
    if [e.primitive.name for e in eqns] != ["call_hi_primitive"]:
        pytest.skip(f"jnp.nonzero is not a hi primitive in JAX {jax.__version__}")
    (eqn,) = eqns
    with Compiles() as compiles:
        (got,) = _abstract.bind_known(eqn.primitive, [mask], eqn.params)
    assert compiles.count == 1
    np.testing.assert_array_equal(got, np.nonzero(mask)[0][:3])
    (another,) = jax.make_jaxpr(lambda m: jnp.nonzero(m, size=3))(mask).jaxpr.eqns
    with Compiles() as compiles:  # another instance of the same kind and types: compiled already
        (again,) = _abstract.bind_known(another.primitive, [~mask], another.params)
    assert compiles.count == 0
    np.testing.assert_array_equal(again, [1, 4, 0])

    def f(m, x):
        return x[jnp.nonzero(m, size=3)[0]] * 2.0

    x = jnp.arange(6.0)
    spec = pejit(f, constant_argnums=0).specialize(mask, x)
    assert "call_hi_primitive" not in {e.primitive.name for e in spec.residual.jaxpr.eqns}
    np.testing.assert_array_equal(pejit(f, constant_argnums=0)(mask, x), jax.jit(f)(mask, x))
