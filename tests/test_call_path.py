"""The call path: a cached call is the memo's constants check and the residual's
own ``jax.jit`` dispatch, for every kind of dynamic argument; it specializes
again exactly where ``jax.jit`` traces again; the cache is bounded in bytes."""

import dataclasses
import functools
import os
import sys
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pejit
from pejit import FoldOptions, pejit as pj
from pejit._jit import call_path

from ._util import Counter, cpu_only, primitive_names

A = jnp.asarray(np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32))


class Pair(NamedTuple):
    a: jax.Array
    b: jax.Array


@functools.partial(jax.tree_util.register_dataclass, data_fields=["w", "step"], meta_fields=[])
@dataclasses.dataclass
class State:
    w: jax.Array
    step: jax.Array


def _total(tree):
    """A value of every leaf of ``tree`` (keys through their data)."""
    leaves = [jax.random.key_data(v) if jnp.issubdtype(v.dtype, jax.dtypes.prng_key) else v
              for v in map(jnp.asarray, jax.tree_util.tree_leaves(tree))]
    return sum(jnp.sum(v.astype(jnp.float32)) for v in leaves)


def _f(S, tree, *rest, **kw):
    return jnp.linalg.inv(S) @ jnp.full(4, _total((tree, rest, kw)))


x = jnp.arange(4.0)
#: One call of each kind of dynamic argument: (name, positional, keywords, jax.jit keywords).
KINDS = [
    ("bare array", (x,), {}, {}),
    ("dict", ({"a": x, "b": 2 * x},), {}, {}),
    ("NamedTuple", (Pair(x, x + 1),), {}, {}),
    ("registered dataclass", (State(x, jnp.int32(3)),), {}, {}),
    ("typed key", (jax.random.key(1),), {}, {}),
    ("raw key", (jax.random.PRNGKey(1),), {}, {}),
    ("Python float", (2.5,), {}, {}),
    ("NumPy scalar", (np.float32(2.5),), {}, {}),
    ("NumPy array", (np.arange(4.0, dtype=np.float32),), {}, {}),
    ("keyword", (x,), {"y": 3 * x}, {}),
    ("static argument", (x, 3), {}, {"static_argnums": 2}),
    ("list of 8 arrays", ([x + i for i in range(8)],), {}, {}),
    ("mixed", ({"k": jax.random.key(2), "s": 1.5}, np.ones(2, np.float32)), {"y": Pair(x, x)}, {}),
]


#: The first call folds (not beside it: see test_beside.py), so that it is the one that misses the memo.
NOT_BESIDE = FoldOptions(beside=False)


def _counting(f):
    """``f`` with its calls past the memo counted (before its first call)."""
    path = call_path(f)
    missed = Counter(path.uncached)
    path.uncached = missed
    return missed


def test_a_layouts_dispatcher_is_generated_by_its_second_call():
    # generating it is a share of a small program's first call, and a function called once needs none
    f = pj(lambda a, x: a * x, constant_argnums=0)
    path = call_path(f)
    a, x = jnp.full(3, 2.0), jnp.arange(3.0)
    np.testing.assert_array_equal(f(a, x), a * x)
    assert path.layout(2).dispatch is None and path.dispatch is path._routing
    np.testing.assert_array_equal(f(a, x), a * x)  # through the cache: a hit
    dispatch = path.layout(2).dispatch
    assert dispatch is not None and path.dispatch is dispatch
    np.testing.assert_array_equal(f(a, 2 * x), a * 2 * x)
    assert f.cache_info()[:2] == (2, 1)


@pytest.mark.parametrize("args, kwargs, jit_kwargs", [k[1:] for k in KINDS], ids=[k[0] for k in KINDS])
def test_every_kind_of_dynamic_argument_is_served_by_the_memo(args, kwargs, jit_kwargs):
    f = pj(_f, constant_argnums=0, fold_options=NOT_BESIDE, **jit_kwargs)
    missed = _counting(f)
    want = jax.jit(_f, **jit_kwargs)(A, *args, **kwargs)
    for _ in range(3):
        np.testing.assert_allclose(f(A, *args, **kwargs), want, rtol=1e-5)
    assert missed.calls == 1  # the first call folds; the others are the memo's
    assert f.cache_info()[:2] == (2, 1)
    assert "lu" not in primitive_names(f.report(A, *args, **kwargs).after)


def _calls(kind):
    """Calls with one property of the dynamic argument changing, and back."""
    f32 = jnp.ones(3, jnp.float32)
    return {
        "shape": [(f32,), (jnp.ones(4),), (f32,)],
        "dtype": [(f32,), (jnp.ones(3, jnp.int32),), (f32,)],
        "weak type": [(1.0,), (jnp.float32(1.0),), (2.0,)],
        "pytree structure": [({"a": f32},), ({"a": f32, "b": f32},), ((f32,),), ({"a": f32},)],
        "key type": [(jax.random.key(0),), (jax.random.PRNGKey(0),), (jax.random.key(5),)],
        "static value": [(f32, 2), (f32, 3), (f32, 2), (f32, 3)],
    }[kind]


@pytest.mark.parametrize("kind", ["shape", "dtype", "weak type", "pytree structure", "key type", "static value"])
def test_a_new_dynamic_type_specializes_exactly_where_jax_jit_traces(kind):
    def g(S, tree, n=1):
        return jnp.sum(S) * _total(tree) * n

    jit_kwargs = {"static_argnums": 2} if kind == "static value" else {}
    ours, theirs = Counter(g), Counter(g)
    f = pj(ours, constant_argnums=0, **jit_kwargs)
    j = jax.jit(theirs, **jit_kwargs)
    for args in _calls(kind) * 2:  # and again, each type known by then
        np.testing.assert_allclose(f(A, *args), j(A, *args), rtol=1e-5)
        assert ours.calls == theirs.calls
    assert f.cache_info().misses == theirs.calls


def test_alternating_dynamic_types_trace_each_once():
    # The same constants with two types: the memo of one type is never asked
    # to serve the other twice (its trace would be jax.jit's, per call).
    ours = Counter(lambda S, x: jnp.linalg.inv(S) @ x[:4] + x.sum())
    f = pj(ours, constant_argnums=0)
    runs = Counter(f.specialize(A, jnp.ones(4)).run)
    for i in range(6):
        v = jnp.ones(4 + i % 2)
        np.testing.assert_allclose(f(A, v), jnp.linalg.inv(A) @ v[:4] + v.sum(), rtol=1e-5)
    assert ours.calls == 2
    assert f.cache_info().misses == 2
    assert runs.calls == 0  # the specializations' runners, not the function


def test_a_residual_called_with_other_types_says_so():
    spec = pj(_inv, constant_argnums=0).specialize(A, jnp.ones(4))
    with pytest.raises(TypeError, match=r"folded for dynamic arguments of types \[float32\[4\]\].* called with \[float32\[5\]\]"):
        spec.call(jnp.ones(5))
    with pytest.raises(TypeError, match=r"int32\[4\]"):
        spec.call(jnp.ones(4, jnp.int32))
    np.testing.assert_allclose(spec.call(jnp.ones(4)), _inv(A, jnp.ones(4)), rtol=1e-6)


@pytest.mark.parametrize("form", ["call-time", "TFC", "auto"])
def test_a_mutated_numpy_constant_is_never_stale_on_the_memo(form):
    a = np.asarray(A).copy()
    g = lambda S, tree: S @ tree["x"]  # noqa: E731
    d = {"x": x}
    if form == "TFC":
        f = pj(a, d, constant_arg_nums=[0])(g)
        call = lambda: f(d)  # noqa: E731
    else:
        f = pj(g, constant_argnums="auto" if form == "auto" else 0)
        call = lambda: f(a, d)  # noqa: E731
    for _ in range(3):
        np.testing.assert_allclose(call(), a @ x, rtol=1e-5)
    a[0, 0] += 10.0
    np.testing.assert_allclose(call(), a @ x, rtol=1e-5)


@pytest.mark.parametrize("form", ["call-time", "TFC"])
def test_a_typed_key_constant_is_known_by_its_identity(form):
    # nobody can change a typed key: the memo checks nothing on a call (a pytree it would
    # flatten again), and the TFC form is one jax.jit function, the key compiled in
    def noisy(key, x):
        return x + jax.random.normal(key, x.shape)

    key, other, x = jax.random.key(3), jax.random.key(4), jnp.ones(4)
    if form == "TFC":
        f = pj(key, x, constant_arg_nums=[0])(noisy)
        np.testing.assert_allclose(f(x), jax.jit(noisy)(key, x), rtol=1e-6)
        assert f._call is f.specialize(x).call  # jax.jit's program, with the key in
    else:
        f = pj(noisy, constant_argnums=0)
        for k in (key, key, other, other):
            np.testing.assert_allclose(f(k, x), jax.jit(noisy)(k, x), rtol=1e-6)
        *_, guard, call = call_path(f).caches.fast_path().last[0]
        assert guard is None and call is f.specialize(other, x).call


def test_the_memo_steps_aside_under_disable_jit_named_axes_and_outer_traces():
    seen = []

    def g(S, x):
        seen.append(type(x))
        return jnp.exp(S) @ x

    f = pj(g, constant_argnums=0)
    f(A, x), f(A, x)
    E = jnp.exp(A)
    with jax.disable_jit():
        np.testing.assert_allclose(f(A, x), E @ x, rtol=1e-5)
    assert not issubclass(seen[-1], jax.core.Tracer)  # run as Python, as jax.jit's under disable_jit
    xs = jnp.stack([x, 2 * x])
    np.testing.assert_allclose(jax.vmap(lambda v: f(A, v), axis_name="i")(xs), xs @ E.T, rtol=1e-5)
    np.testing.assert_allclose(jax.grad(lambda v: f(A, v).sum())(x), E.sum(0), rtol=1e-5)
    np.testing.assert_allclose(jax.jit(lambda v: f(A, v))(x), E @ x, rtol=1e-5)


# -- the byte budget ---------------------------------------------------------------
def _inv(S, x):
    return jnp.linalg.inv(S) @ x


def test_the_cache_is_bounded_in_bytes_least_recently_used_first():
    n = 32  # each fold keeps inv(S): 4 KiB
    mats = [jnp.eye(n) * (i + 2.0) for i in range(5)]
    f = pj(_inv, constant_argnums=0, cache_bytes=3 * n * n * 4)
    v = jnp.ones(n)
    for m in mats[:3]:
        f(m, v)
    info = f.cache_info()
    assert (info.currsize, info.currbytes, info.maxbytes) == (3, 3 * n * n * 4, 3 * n * n * 4)
    f(mats[0], v)  # the most recent now
    f(mats[3], v)  # evicts mats[1]
    assert f.cache_info().currsize == 3
    misses = f.cache_info().misses
    f(mats[0], v), f(mats[2], v), f(mats[3], v)
    assert f.cache_info().misses == misses
    np.testing.assert_allclose(f(mats[1], v), v / 3.0, rtol=1e-6)
    assert f.cache_info().misses == misses + 1


def test_a_fold_larger_than_the_budget_is_kept_alone():
    f = pj(_inv, constant_argnums=0, cache_bytes=16)
    v, mats = jnp.ones(8), [jnp.eye(8) * (i + 1.0) for i in range(3)]
    for i, m in enumerate(mats):
        np.testing.assert_allclose(f(m, v), v / (i + 1.0), rtol=1e-6)
    assert (f.cache_info().currsize, f.cache_info().currbytes) == (1, 8 * 8 * 4)


def test_cache_bytes_defaults_and_is_validated():
    assert pj(_inv, constant_argnums=0).cache_info().maxbytes == pejit.DEFAULT_CACHE_BYTES
    assert pj(_inv, constant_argnums=0, cache_bytes=None).cache_info().maxbytes is None
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="cache_bytes must be a non-negative int or None"):
            pj(_inv, constant_argnums=0, cache_bytes=bad)


def test_a_constant_that_changes_on_every_call_is_warned_about_once():
    f = pj(lambda a, x: a * x, constant_argnums=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(40):
            f(jnp.full(3, float(i)), x[:3])
    hits = [w for w in caught if issubclass(w.category, pejit.RespecializingWarning)]
    assert len(hits) == 1
    assert "16 of its 16 calls folded new constant values" in str(hits[0].message)
    assert hits[0].filename == __file__


def test_constants_that_repeat_are_not_warned_about():
    f = pj(lambda a, x: a * x, constant_argnums=0)
    consts = [jnp.full(3, float(i)) for i in range(20)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", pejit.RespecializingWarning)
        for c in consts:
            f(c, x[:3]), f(c, x[:3])


def test_a_pytree_constant_is_memoized_and_its_changes_are_seen():
    d = {"S": A, "scale": 2.0}
    f = pj(lambda d, x: jnp.linalg.inv(d["S"]) @ x * d["scale"], constant_argnums=0, fold_options=NOT_BESIDE)
    missed = _counting(f)
    for _ in range(3):
        np.testing.assert_allclose(f(d, x), _inv(A, x) * 2.0, rtol=1e-5)
    assert missed.calls == 1
    d["scale"] = 3.0  # the same dict, other contents
    np.testing.assert_allclose(f(d, x), _inv(A, x) * 3.0, rtol=1e-5)
    d["S"] = 2 * A
    np.testing.assert_allclose(f(d, x), _inv(2 * A, x) * 3.0, rtol=1e-5)
    d["more"] = np.ones(2)
    np.testing.assert_allclose(f(d, x), _inv(2 * A, x) * 3.0, rtol=1e-5)
    assert f.cache_info().misses == 4


# -- the TFC form's call -----------------------------------------------------------
def _pejit_frames(call) -> set[str]:
    """The files of pejit's Python functions that ``call()`` runs (its generated dispatch included)."""
    root, files = os.path.dirname(pejit.__file__), set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            files.add(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return files


def _read_only(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


def _frames_entered(call) -> list[str]:
    """The Python frames of pejit's that ``call()`` enters, in order: its modules', and
    the code it generates or evaluates (a file named ``<string>`` too); not those of
    ``_compat``'s shims of older JAX versions (JAX 0.7's current trace is read through one)."""
    root, names = os.path.dirname(pejit.__file__), []
    shims = os.path.join(root, "_compat", "")

    def profile(frame, event, arg):
        filename = frame.f_code.co_filename
        if event == "call" and (filename.startswith(root) or filename == "<string>") and not filename.startswith(shims):
            names.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return names


def _promoted(g, C, v):
    """``g`` with ``C`` promoted to a constant by ``constant_argnums="auto"``, its decisions settled."""
    f = pj(g, constant_argnums="auto", auto_min_flops=0)
    for w in (v, 2 * v, 3 * v, 4 * v, 5 * v, v):  # v changes: kept dynamic after the fourth change
        f(C, w)
    assert f.decisions()[0][0] == "promoted" and f.decisions()[1][0] == "kept dynamic"
    return f


@pytest.mark.parametrize("form, frames", [
    ("no constants", []),  # jax.jit's own object
    ("constant_argnums", ["dispatch"]),
    ("constant_argnums='auto', promoted", ["dispatch"]),  # the promoted path's own dispatcher
    ("TFC, constants placed", ["dispatch"]),  # not compiled in: the generated dispatch binds them
])
def test_a_cached_call_is_at_most_one_frame_of_pejits(form, frames):
    v = jnp.ones(4)
    f = {
        "no constants": lambda: pj(_inv),
        "constant_argnums": lambda: pj(_inv, constant_argnums=0),
        "constant_argnums='auto', promoted": lambda: _promoted(_inv, A, v),
        "TFC, constants placed": lambda: pj(A, v, constant_arg_nums=[0], constant_shardings=A.sharding)(_inv),
    }[form]()
    call = (lambda: f(v)) if form.startswith("TFC") else (lambda: f(A, v))
    call(), call()
    assert _frames_entered(call) == frames
    np.testing.assert_allclose(call(), _inv(A, v), rtol=1e-5)


@pytest.mark.parametrize("kind", [
    "jax.Array", "read-only NumPy",
    # np.asarray views a jax.Array's memory on the CPU alone (elsewhere it is
    # a host copy whose owner pejit cannot see)
    pytest.param("NumPy view of a jax.Array", marks=cpu_only),
])
def test_the_tfc_form_with_fixed_small_constants_calls_without_python(kind):
    # TFC's grids are read-only NumPy views of jax.Arrays: nobody can change
    # them, so the call is jax.jit's alone, the residual compiled into it
    S = {"jax.Array": A, "read-only NumPy": _read_only(A), "NumPy view of a jax.Array": np.asarray(A)}[kind]
    f = pj(S, x, constant_arg_nums=[0])(_inv)
    np.testing.assert_allclose(f(x), _inv(A, x), rtol=1e-5)
    f.specialize(x), f(x)  # once folded (beside the first calls, which run jax.jit's program), and traced
    assert _pejit_frames(lambda: f(2 * x)) == set()
    np.testing.assert_allclose(f(2 * x), _inv(A, 2 * x), rtol=1e-5)
    X = jnp.stack([x, 3 * x], axis=1)  # a new type: traced again, specialized inside
    np.testing.assert_allclose(f(X), _inv(A, X), rtol=1e-5)
    np.testing.assert_allclose(jax.vmap(f)(X.T), _inv(A, X).T, rtol=1e-5)
    with pytest.raises(TypeError, match="takes 1 positional argument"):
        f(x, x)


@pytest.mark.parametrize("mode", ["inv", None, b"inv"])
def test_the_tfc_form_with_string_and_none_constants_calls_without_python(mode):
    # str, bytes and None cannot change either (the memo holds them as it
    # holds scalars): the call is jax.jit's alone
    def solve(S, mode, x):
        return _inv(S, x) if mode else _inv(2 * S, x)

    f = pj(A, mode, x, constant_arg_nums=[0, 1])(solve)
    np.testing.assert_allclose(f(x), solve(A, mode, x), rtol=1e-5)
    f.specialize(x), f(x)  # once folded, and traced
    assert _pejit_frames(lambda: f(2 * x)) == set()
    np.testing.assert_allclose(f(2 * x), solve(A, mode, 2 * x), rtol=1e-5)


@pytest.mark.parametrize("kind", ["writable NumPy", "large"])
def test_the_tfc_form_checks_its_constants_in_python_when_it_must(kind):
    # a writable NumPy constant can change between calls (the memo checks its
    # bytes); large folded constants are not copied into the program
    if kind == "large":
        S = jnp.eye(600) + 0.01 * jnp.ones((600, 600))  # its inverse: 1.4 MB
        v = jnp.ones(600)
    else:
        S, v = np.asarray(A).copy(), x
    f = pj(S, v, constant_arg_nums=[0])(_inv)
    f(v)
    assert _pejit_frames(lambda: f(v))
    np.testing.assert_allclose(f(v), _inv(S, v), rtol=1e-4)
