"""pejit as a drop-in for jax.jit: without constant arguments it behaves as jax.jit does.

Each test compares with ``jax.jit`` itself at run time (errors are its own
words in the installed JAX), for ``pejit(f, ...)`` ("plain") and for
``pejit(f, constant_argnums="auto", ...)`` ("auto"), whose calls are
``jax.jit``'s until an argument is promoted. Where constants are involved,
the tests say what pejit does instead and why.
"""

from __future__ import annotations

import functools
import gc
import pickle
import re
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pejit import explain, pejit

MODES = {"plain": {}, "auto": {"constant_argnums": "auto"}}


@pytest.fixture(params=sorted(MODES))
def jit(request):
    """``pejit`` in one of the modes, called as ``jax.jit`` is."""

    def make(fun=None, /, **kwargs):
        if fun is None:
            return functools.partial(make, **kwargs)
        return pejit(fun, **MODES[request.param], **kwargs)

    return make


def raised(thunk) -> BaseException:
    try:
        thunk()
    except Exception as e:  # noqa: BLE001
        return e
    raise AssertionError(f"{thunk} raised nothing")


def first_line(e: BaseException) -> str:
    """The first line of the message, object addresses left out."""
    return re.sub(r"0x[0-9a-f]+", "0x?", str(e).splitlines()[0])


def same_error(ours, theirs) -> BaseException:
    """``ours()`` raises what ``theirs()`` (with jax.jit) raises: type and message."""
    e, expected = raised(ours), raised(theirs)
    assert type(e) is type(expected)
    assert first_line(e) == first_line(expected)
    return e


def module_level(x, y):
    return jnp.sin(x) * y


# -- jax.disable_jit ---------------------------------------------------------------

def test_disable_jit_runs_python_on_every_call(jit):
    runs = []

    @jit
    def f(x):
        runs.append(x)
        return x + 1

    with jax.disable_jit():
        assert f(2) == 3 and f(2) == 3
    assert runs == [2, 2]  # concrete values, no trace
    f(2)
    f(2)
    assert len(runs) == 3  # traced once, then cached


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # a * x folds nothing
def test_disable_jit_with_constants_runs_the_function_unfolded():
    seen = []

    def f(a, x):
        seen.append((type(a), type(x)))
        return a * x

    g = pejit(f, constant_argnums=0)
    a, x = jnp.ones(2), jnp.arange(2.0)
    np.testing.assert_array_equal(g(a, x), a * x)  # folds, traces once
    n = len(seen)
    with jax.disable_jit():
        np.testing.assert_array_equal(g(a, x), a * x)
        np.testing.assert_array_equal(g(a, x=x), a * x)
    assert len(seen) == n + 2
    assert seen[-1] == (type(a), type(x))  # the arrays themselves, as jax.jit under disable_jit
    g(a, x)
    assert len(seen) == n + 2  # out of it, the specialization again


# -- caches --------------------------------------------------------------------------

def test_cache_size_and_clear_cache(jit):
    f = jit(lambda x: (x**2).sum())
    assert f._cache_size() == 0
    x = jnp.arange(4.0)
    for _ in range(3):
        f(x)
    assert f._cache_size() == 1
    f(jnp.arange(5.0))
    assert f._cache_size() == 2
    f.clear_cache()
    assert f._cache_size() == 0
    assert f(x) == 14.0


def test_clear_cache_with_constants_drops_specializations():
    f = pejit(lambda a, x: jnp.sin(a) * x, constant_argnums=0)
    a, b = jnp.ones(2), jnp.zeros(2)  # a specialization lives as long as its constant
    f(a, jnp.ones(2))
    f(b, jnp.ones(2))
    assert f._cache_size() == 2 == f.cache_info().currsize
    f.clear_cache()
    assert f._cache_size() == 0 == f.cache_info().currsize


def test_caches_are_shared_with_other_jit_objects_of_the_function(jit):
    traces = []

    def f(x):
        traces.append(x)
        return x

    jit(f)(2)
    jit(f)(3)
    jax.jit(f)(4)
    assert len(traces) == 1  # jax.jit's global cache, keyed on the function


def test_caches_depend_on_the_axis_environment(jit):
    g = jit(lambda: jax.lax.axis_size("i"))
    for n in (2, 3):
        assert jax.vmap(g, axis_name="i", axis_size=n, out_axes=None)() == n


def test_closed_over_values_are_staged_not_folded(jit):
    # Without constant arguments nothing is folded: work on closed-over values
    # is staged, as under jax.jit (omnistaging), so it sees tracers.
    seen = []
    c = jnp.arange(3.0)

    def f():
        y = jnp.sin(c)
        seen.append(y)
        return y

    np.testing.assert_allclose(jit(f)(), np.sin(np.arange(3.0)), rtol=1e-6)
    assert isinstance(seen[-1], jax.core.Tracer)


# -- references ----------------------------------------------------------------------

def test_holds_no_references_after_the_object_dies(jit):
    x = jnp.ones(10)
    g = jit((lambda x: lambda: x)(x))  # only g holds x, through the closure
    x = weakref.ref(x)
    for _ in range(3):
        g()
    assert x() is not None
    del g  # no gc.collect: no reference cycle keeps x alive
    assert x() is None


def test_holds_no_arguments_or_results_between_calls(jit):
    f = jit(lambda x: x * 2)
    x = jnp.ones(10)
    y = f(x)
    f(x)
    refs = weakref.ref(x), weakref.ref(y)
    del x, y
    assert [r() for r in refs] == [None, None]


# -- what jit accepts ---------------------------------------------------------------

class _Slots:
    __slots__ = ()

    def __call__(self, x):
        return x + 1


def _gen(x):
    yield x


@pytest.mark.parametrize("fun", [3, staticmethod(lambda x: x), classmethod(lambda c, x: x), _gen],
                         ids=["not callable", "staticmethod", "classmethod", "generator"])
def test_functions_jax_jit_rejects(jit, fun):
    same_error(lambda: jit(fun), lambda: jax.jit(fun))


def test_staticmethod_in_a_class_body(jit):
    with pytest.raises(TypeError, match="staticmethod arguments are not supported"):
        class A:  # noqa: F841
            @jit
            @staticmethod
            def m(x):
                return x


#: jaxlib (0.10 to 0.12 at least) may crash when a jax.jit object of a function
#: without weak references is freed: the tests keep theirs.
_KEEP_ALIVE = []


def test_callable_without_weak_references(jit):
    f = jit(_Slots())  # building works, as with jax.jit
    theirs = jax.jit(_Slots())
    _KEEP_ALIVE.extend([f, theirs])
    same_error(lambda: f(3), lambda: theirs(3))


def test_callable_without_weak_references_with_constants():
    # pejit needs no weak reference to the function to fold and call it
    f = pejit(_Slots(), constant_argnums=0)
    assert f(jnp.float32(1.0)) == 2.0


def test_unhashable_static_arguments(jit):
    f = jit(lambda x, y: x + 3, static_argnums=1)
    f(1, 1)
    same_error(lambda: f(1, np.asarray(1)), lambda: jax.jit(lambda x, y: x + 3, static_argnums=1)(1, np.asarray(1)))

    class HashableWithoutEq:
        def __hash__(self):
            return 1

        def __eq__(self, other):
            raise NotImplementedError("no __eq__")

    g = jax.jit(lambda x, y: x + 3, static_argnums=1)
    g(1, HashableWithoutEq())
    f(1, HashableWithoutEq())
    same_error(lambda: f(1, HashableWithoutEq()), lambda: g(1, HashableWithoutEq()))


@pytest.mark.parametrize("kind", ["static_argnums", "donate_argnums"])
def test_argnums_as_jax_jit_checks_them(jit, kind):
    def f(a, b, c):
        return a

    def h(a, *args):
        return a

    jit(f, **{kind: (0, 1, -3)})  # -3 is 0 again: accepted
    jit(h, **{kind: (0, 999)})
    jit(h, **{kind: (0, -999)})
    for bad in [(0, 1, 3), (0, 1, -4)]:
        same_error(lambda: jit(f, **{kind: bad}), lambda: jax.jit(f, **{kind: bad}))


def test_static_argnums_duplicates_with_constants():
    def f(a, b, c):
        return jnp.exp(a) * c

    g = pejit(f, constant_argnums=0, static_argnums=(1, -2))  # -2 is 1 again
    assert g(jnp.float32(0.0), "tag", jnp.float32(3.0)) == 3.0


def test_intersecting_static_and_donate_argnames(jit):
    same_error(lambda: jit(lambda x: x, static_argnames="x", donate_argnames="x"),
               lambda: jax.jit(lambda x: x, static_argnames="x", donate_argnames="x"))


def test_jax_jit_checks_come_first_with_constants():
    def f(a, x):
        return a * x

    same_error(lambda: pejit(f, constant_argnums=0, static_argnums=5), lambda: jax.jit(f, static_argnums=5))


def test_donate_argnames_without_a_signature(jit):
    class NoSignature:
        @property
        def __signature__(self):
            raise TypeError("no signature")

        def __call__(self, *args):
            return args[0]

    same_error(lambda: jit(NoSignature(), donate_argnames="a")(1, 2),
               lambda: jax.jit(NoSignature(), donate_argnames="a")(1, 2))


def _tracer_kinds(jitted, *args, **kwargs):
    kinds = []

    def f(x, y):
        kinds.append((isinstance(x, jax.core.Tracer), isinstance(y, jax.core.Tracer)))
        return 1

    jitted(f)(*args, **kwargs)
    return kinds


@pytest.mark.parametrize("options", [
    {"static_argnums": 1, "static_argnames": ()},
    {"static_argnums": (), "static_argnames": "y"},
    {"static_argnums": 1, "static_argnames": "x"},
], ids=["nums only", "names only", "disagreeing"])
@pytest.mark.parametrize("call", [((2, "s"), {}), ((1,), {"y": 3}), ((), {"x": "s", "y": 3})],
                         ids=["positional", "keyword y", "keywords"])
def test_static_argnums_and_argnames_may_disagree(jit, options, call):
    args, kwargs = call
    try:
        theirs = _tracer_kinds(lambda f: jax.jit(f, **options), *args, **kwargs)
    except Exception:  # noqa: BLE001 -- jax.jit rejects this call; so must pejit
        same_error(lambda: _tracer_kinds(lambda f: jit(f, **options), *args, **kwargs),
                   lambda: _tracer_kinds(lambda f: jax.jit(f, **options), *args, **kwargs))
        return
    assert _tracer_kinds(lambda f: jit(f, **options), *args, **kwargs) == theirs


def test_bad_input(jit):
    for bad in ["foo", jnp.int32]:
        same_error(lambda: jit(lambda x: x)(bad), lambda: jax.jit(lambda x: x)(bad))


def test_compiled_called_with_other_types(jit):
    def f(x):
        return jnp.sqrt(x**2) + 1.0

    x = jnp.array(1, jnp.float32)
    ours, theirs = jit(f).lower(x).compile(), jax.jit(f).lower(x).compile()
    same_error(lambda: ours(x.astype(jnp.int32)), lambda: theirs(x.astype(jnp.int32)))
    same_error(lambda: ours([4.0]), lambda: theirs([4.0]))


# -- repr, name, pickling ------------------------------------------------------------

def _named(fun):
    fun.__name__ = "my_partial"
    return fun


def _my_function():
    return 1


@pytest.mark.parametrize("fun", [
    _my_function, functools.partial(_my_function), functools.partial(functools.partial(_my_function)),
    _named(functools.partial(_my_function)), lambda: _my_function(),
], ids=["function", "partial", "nested partial", "named partial", "lambda"])
def test_repr_and_function_name_are_jax_jits(jit, fun):
    assert repr(jit(fun)) == repr(jax.jit(fun))
    assert jit(fun).__getstate__()["function_name"] == jax.jit(fun).__getstate__()["function_name"]


def test_repr_when_the_functions_repr_fails(jit):
    class BadRepr:
        def __call__(self):
            return 1

        def __repr__(self):
            raise ValueError("no repr")

    f = jit(BadRepr())
    assert repr(f) == repr(jax.jit(BadRepr()))
    del f.__wrapped__
    assert repr(f) == repr(jax.jit(BadRepr()))


def test_repr_with_constants_names_pejit_and_the_function():
    assert repr(pejit(module_level, constant_argnums=0)) == f"<pejit function of {module_level!r}>"


def test_module_name_is_the_functions(jit):
    text = jit(functools.partial(module_level, jnp.ones(2))).lower(jnp.ones(2)).as_text()
    assert "module @jit_module_level" in text


@pytest.mark.parametrize("options", [{}, {"constant_argnums": 0}, {"constant_argnums": "auto"}],
                         ids=["plain", "constants", "auto"])
def test_pickles_as_its_function_and_options(options):
    f = pejit(module_level, **options)
    a, x = jnp.arange(3.0), jnp.ones(3)
    g = pickle.loads(pickle.dumps(f))
    assert type(g) is type(f) and g.__wrapped__ is module_level
    np.testing.assert_array_equal(g(a, x), f(a, x))


# -- reports of a function with nothing to fold ---------------------------------------

def test_report_without_constants_is_jax_jits_program():
    c = jnp.arange(3.0)
    f = pejit(lambda x: jnp.sin(c) * x)
    spec = f.specialize(jnp.ones(3))
    assert spec.report.folded_eqns == 0
    assert [e.primitive.name for e in spec.residual.jaxpr.eqns] == [
        e.primitive.name for e in jax.jit(lambda x: jnp.sin(c) * x).trace(jnp.ones(3)).jaxpr.eqns
    ]
    assert "no constant arguments" in spec.report.fallbacks[0]
    np.testing.assert_allclose(spec.call(jnp.ones(3)), np.sin(np.arange(3.0)), rtol=1e-6)
    assert explain(f, jnp.ones(3)).folded_eqns == 0


def test_methods_bind_as_jax_jits(jit):
    class A:
        @jit(static_argnums=0)
        def m(self, x):
            return x + 1

    a = A()
    assert type(a.m) is type(jax.jit(lambda self, x: x).__get__(a, A))
    assert a.m.__self__ is a and a.m(1) == 2


def test_compiled_with_constants_names_dynamic_arguments_as_jax_jit():
    # the residual program's runner has the function's parameter names
    def f(a, x, *, s=1.0):
        return jnp.sin(a) * x * s

    a, x = jnp.ones(2), jnp.ones(2)
    ours = pejit(f, constant_argnums=0).lower(a, x).compile()
    theirs = jax.jit(f).lower(a, x).compile()
    e, expected = raised(lambda: ours(a, x.astype(jnp.int32))), raised(lambda: theirs(a, x.astype(jnp.int32)))
    assert type(e) is type(expected)
    mismatch = [line for line in str(expected).splitlines() if line.startswith("Argument 'x'")]
    assert mismatch and mismatch[0] in str(e).splitlines()
    np.testing.assert_array_equal(ours(a, x), theirs(a, x))


def test_specializations_depend_on_the_axis_environment():
    # folding evaluates what the function reads of the named axes, so they key the specialization
    a = jnp.ones(2)
    f = pejit(lambda a, x: jnp.sin(a) * x * jax.lax.axis_size("i"), constant_argnums=0)
    g = pejit(lambda a: jax.lax.axis_size("i") * a, constant_argnums=0)
    for n in (2, 3, 2):
        ours = jax.vmap(lambda x: f(a, x), axis_name="i")(jnp.ones((n, 2)))
        np.testing.assert_allclose(ours, np.full((n, 2), n * np.sin(1.0)), rtol=1e-6)
        np.testing.assert_array_equal(jax.vmap(lambda x: g(a) + x, axis_name="i")(jnp.zeros((n, 2))), n)
    assert f.cache_info().currsize == 2  # one per axis size
