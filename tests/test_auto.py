"""constant_argnums="auto": promotion, demotion, guards, transforms, effects, errors."""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pejit import AutoCacheInfo, CacheInfo, FoldOptions, explain, pe, pejit

from ._util import Compiles, primitive_names, with_f32_products


def loss(w, X):
    L = jnp.linalg.cholesky(X.T @ X + jnp.eye(X.shape[1]))
    return jnp.sum((L @ w) ** 2)


def data(seed, n=6, m=4):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((n, m)), jnp.float32)


ws = [jnp.full(4, float(i)) for i in range(12)]


def check(f, *args, **kwargs):
    np.testing.assert_allclose(f(*args, **kwargs), jax.jit(loss)(*args, **kwargs), rtol=1e-5, atol=1e-5)


def test_promotes_a_repeated_argument_and_folds_it():
    f = pejit(loss, constant_argnums="auto", auto_min_flops=0)
    X = data(0)
    check(f, ws[0], X)
    assert f.decisions()[1][0] == "watching"
    check(f, ws[1], X)  # the same X twice: promoted, folded
    for w in ws[2:6]:
        check(f, w, X)
    state, why = f.decisions()[1]
    assert state == "promoted" and "2 consecutive calls" in why
    assert f.decisions()[0][0] == "kept dynamic"  # w changes every call
    info = f.cache_info()
    assert isinstance(info, CacheInfo) and isinstance(info, AutoCacheInfo)
    assert (info.promotions, info.demotions, info.generic_calls, info.misses) == (1, 0, 1, 1)
    hits, misses, maxsize, currsize = info  # still unpacks as CacheInfo
    assert (hits, misses, currsize) == (4, 1, 1)
    report = f.report(ws[0], X)
    assert report.fold.folded_eqns > 0 and "cholesky" not in primitive_names(report.after)
    assert "promoted" in str(report)


def test_auto_after_counts_consecutive_calls():
    f = pejit(loss, constant_argnums="auto", auto_after=3, auto_min_flops=0)
    X = data(0)
    for w in ws[:2]:
        check(f, w, X)
    assert f.cache_info().promotions == 0
    check(f, ws[2], X)
    assert f.cache_info().promotions == 1 and f.cache_info().generic_calls == 2


def test_a_changed_argument_runs_the_generic_program_never_a_new_fold():
    f = pejit(loss, constant_argnums="auto", auto_min_flops=0)
    X, Y = data(0), data(1)
    for w in ws[:3]:
        check(f, w, X)
    before = f.cache_info()
    check(f, ws[3], Y)  # promoted argument changed: generic
    after = f.cache_info()
    assert after.misses == before.misses and after.generic_calls == before.generic_calls + 1
    check(f, ws[4], Y)  # stable again on Y: its fold is due
    assert f.cache_info().misses == before.misses + 1 and f.cache_info().promotions == 2
    check(f, ws[5], X)  # back to X: generic again (its fold is kept but the guard wants Y)
    assert f.cache_info().misses == before.misses + 1


def test_alternating_inputs_are_demoted_and_never_thrash():
    f = pejit(loss, constant_argnums="auto", auto_min_flops=0)
    X, Y = data(0), data(1)
    check(f, ws[0], X)
    check(f, ws[1], X)  # promoted
    for i, w in enumerate(ws[2:]):
        check(f, w, X if i % 2 else Y)
    info = f.cache_info()
    assert info.misses == 1 and info.demotions == 1
    state, why = f.decisions()[1]
    assert state == "demoted" and "auto_demote_after=3" in why
    g = pejit(loss, constant_argnums="auto", auto_min_flops=0, auto_demote_after=0)
    for i, w in enumerate(ws):
        check(g, w, X if i % 2 else Y)
    assert g.cache_info().misses == 0 and g.cache_info().promotions == 0
    assert g.decisions()[1][0] == "kept dynamic"


def test_cheap_folds_are_not_promoted_and_the_reason_is_recorded():
    f = pejit(lambda w, X: jnp.sum(X @ w), constant_argnums="auto")  # X @ w: nothing to fold
    X = data(0)
    for w in ws[:6]:
        np.testing.assert_allclose(f(w, X), jnp.sum(X @ w), rtol=1e-6)
    state, why = f.decisions()[1]
    assert state == "kept dynamic" and "auto_min_flops" in why
    assert f.cache_info().misses == 0 and f.cache_info().promotions == 0
    assert f.report(ws[0], X).fold is None
    # settled on the generic program: calls go straight to jax.jit, uncounted
    settled = f.cache_info().generic_calls
    for w in ws[6:9]:
        np.testing.assert_allclose(f(w, X), jnp.sum(X @ w), rtol=1e-6)
    assert f.cache_info().generic_calls == settled
    big = pejit(loss, constant_argnums="auto", auto_min_flops=1e12)
    X = data(0)
    for w in ws[:3]:
        check(big, w, X)
    assert big.decisions()[1][0] == "kept dynamic" and big.cache_info().misses == 0


def test_a_dead_promoted_array_never_gives_a_stale_hit_on_its_recycled_id():
    f = pejit(loss, constant_argnums="auto", auto_min_flops=0)
    seen_same_id = False
    X = data(0)
    for seed in range(1, 30):
        check(f, ws[0], X)
        check(f, ws[1], X)  # promoted on this X
        old = id(X)
        del X
        gc.collect()
        X = data(seed)  # often lands on the dead array's id
        seen_same_id |= id(X) == old
        check(f, ws[2], X)  # a new value: never the folded old one
    assert f.cache_info().misses >= 1
    if not seen_same_id:
        pytest.skip("CPython did not reuse an id in this run; values were still checked")


def test_read_only_numpy_is_promoted_writable_numpy_never():
    X = np.array(data(0))
    X.flags.writeable = False
    f = pejit(loss, constant_argnums="auto", auto_min_flops=0)
    for w in ws[:3]:
        check(f, w, X)
    assert f.decisions()[1][0] == "promoted"

    W = np.array(data(0))  # writable: may change in place between calls
    g = pejit(loss, constant_argnums="auto", auto_min_flops=0)
    for k, w in enumerate(ws[:5]):
        W[0, 0] = k  # mutated in place: the result must follow
        np.testing.assert_allclose(g(w, W), jax.jit(loss)(w, jnp.asarray(W)), rtol=1e-5, atol=1e-5)
    state, why = g.decisions()[1]
    assert state == "kept dynamic" and "NumPy array whose memory may be written" in why
    assert g.cache_info().promotions == 0 and g.cache_info().misses == 0

    view = np.asarray(data(0)).copy()
    frozen_view = view[:]  # read-only view of writable memory: still mutable
    frozen_view.flags.writeable = False
    h = pejit(loss, constant_argnums="auto", auto_min_flops=0)
    for w in ws[:3]:
        check(h, w, frozen_view)
    assert h.cache_info().promotions == 0


def test_keyword_arguments_are_candidates_too():
    f = pejit(loss, constant_argnums="auto", auto_min_flops=0)
    X = data(0)
    for w in ws[:4]:
        check(f, w, X=X)
    assert f.decisions()["X"][0] == "promoted" and f.cache_info().misses == 1


@pytest.mark.parametrize("promoted", ["by position", "by keyword"])
def test_keywords_pass_the_generated_call_once_decided(promoted):
    # After the decisions, a call is the generated guard and the Pejitted:
    # other keywords (a dynamic one, a pytree) do not send it back to watching.
    def g(w, X, *, scale, extra):
        return loss(w * scale, X) + extra["b"]

    f = pejit(g, constant_argnums="auto", auto_min_flops=0)
    X = data(0)

    def call(i):
        kwargs = {"scale": ws[i], "extra": {"b": ws[i][0]}}
        if promoted == "by keyword":
            return f(ws[i], X=X, **kwargs)
        return f(ws[i], X, **kwargs)

    for i in range(6):  # w and scale change on each call: dynamic after the fourth change
        call(i)
    watching = f._watching
    f._watching = None  # the generated call holds its own reference: calls must not reach this one
    for i in range(6, 12):
        np.testing.assert_allclose(call(i), jax.jit(g)(ws[i], X, scale=ws[i], extra={"b": ws[i][0]}), rtol=1e-5)
    f._watching = watching
    assert f.cache_info().promotions == 1 and f.cache_info().misses == 1


def test_static_and_donated_arguments_are_not_candidates():
    def g(w, X, k):
        return loss(w, X) * k

    f = pejit(g, constant_argnums="auto", static_argnums=2, auto_min_flops=0)
    X = data(0)
    for w in ws[:4]:
        np.testing.assert_allclose(f(w, X, 3), 3 * jax.jit(loss)(w, X), rtol=1e-5)
    assert set(f.decisions()) == {0, 1} and f.decisions()[1][0] == "promoted"


def test_threads_share_one_function():
    f = pejit(loss, constant_argnums="auto", auto_min_flops=0)
    X = data(0)
    want = [jax.jit(loss)(w, X) for w in ws]
    errors = []

    def work():
        try:
            for _ in range(5):
                mine = [w + 0 for w in ws]  # this thread's own objects: never the same on two calls
                for w, expected in zip(mine, want):
                    np.testing.assert_allclose(f(w, X), expected, rtol=1e-5, atol=1e-5)
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert f.decisions()[1][0] == "promoted" and f.cache_info().misses == 1


def test_transforms_around_it_agree_with_jax_jit():
    f = pejit(loss, constant_argnums="auto", auto_min_flops=0)
    X = data(0)
    for w in ws[:3]:
        f(w, X)
    assert f.decisions()[1][0] == "promoted"
    w = ws[3] + 0.5
    np.testing.assert_allclose(jax.grad(f)(w, X), jax.grad(loss)(w, X), rtol=1e-4)
    np.testing.assert_allclose(jax.grad(f, argnums=1)(w, X), jax.grad(loss, argnums=1)(w, X), rtol=1e-4)
    batch = jnp.stack(ws[:3])
    np.testing.assert_allclose(jax.vmap(f, (0, None))(batch, X), jax.vmap(loss, (0, None))(batch, X), rtol=1e-5)
    Xs = jnp.stack([data(1), data(2)])
    np.testing.assert_allclose(jax.vmap(f, (None, 0))(w, Xs), jax.vmap(loss, (None, 0))(w, Xs), rtol=1e-5)
    np.testing.assert_allclose(jax.jit(f)(w, X), loss(w, X), rtol=1e-5)
    np.testing.assert_allclose(jax.jit(lambda w: f(w, X))(w), loss(w, X), rtol=1e-5)
    # tracers were never promoted and left the decision on X alone
    assert f.decisions()[1][0] == "promoted" and f.cache_info().misses == 1


def test_effects_run_on_every_call():
    seen = []

    def g(w, X):
        jax.debug.callback(lambda s: seen.append(float(s)), jnp.sum(X))
        return loss(w, X)

    f = pejit(g, constant_argnums="auto", auto_min_flops=0)
    X = data(0)
    for w in ws[:6]:
        f(w, X)
    jax.effects_barrier()
    assert f.decisions()[1][0] == "promoted"
    assert len(seen) == 6 and np.allclose(seen, float(jnp.sum(X)))


def test_errors_are_jax_jits():
    def branchy(w, X):
        if X.sum() > 0:  # fine for pejit's explicit constants, an error under jax.jit
            return w
        return -w

    f = pejit(branchy, constant_argnums="auto", auto_min_flops=0)
    X = data(0)
    for w in ws[:4]:
        with pytest.raises(jax.errors.ConcretizationTypeError):
            f(w, X)
    assert f.cache_info().promotions == 0
    g = pejit(loss, constant_argnums="auto", auto_min_flops=0)
    for w in ws[:3]:
        g(w, X)
    with pytest.raises(TypeError) as ours:
        g(jnp.ones(5), X)
    with pytest.raises(TypeError) as theirs:
        jax.jit(loss)(jnp.ones(5), X)
    assert type(ours.value) is type(theirs.value)


def test_pe_form_and_explain():
    f = pe(loss, constant_argnums="auto", auto_min_flops=0)
    X = data(0)
    for w in ws[:3]:
        check(f, w, X)
    assert f.decisions()[1][0] == "promoted"
    r = explain(f, ws[0], X)
    assert r.flops_removed > r.flops_residual > 0 and "promoted" in str(r)
    with pytest.raises(AttributeError, match="use pejit, not pe"):
        f.lower(ws[0], X)
    with pytest.raises(TypeError, match="already knows"):
        explain(f, ws[0], X, constant_argnums=1)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"auto_after": 0}, ValueError, "auto_after must be an int >= 1"),
    ({"auto_after": True}, ValueError, "auto_after"),
    ({"auto_after": 1.5}, ValueError, "auto_after"),
    ({"auto_demote_after": -1}, ValueError, "auto_demote_after must be an int >= 0"),
    ({"auto_min_flops": -1}, ValueError, "auto_min_flops must be a number >= 0"),
    ({"auto_min_flops": float("nan")}, ValueError, "auto_min_flops"),
    ({"auto_min_flops": "1e6"}, ValueError, "auto_min_flops"),
])
def test_bad_auto_keywords(kwargs, error, match):
    with pytest.raises(error, match=match):
        pejit(loss, constant_argnums="auto", **kwargs)


def test_auto_keywords_need_auto():
    with pytest.raises(TypeError, match="auto_after only apply with constant_argnums='auto'"):
        pejit(loss, constant_argnums=1, auto_after=3)
    with pytest.raises(TypeError, match="constant_argnums must be an int, a sequence of ints or 'auto', got str"):
        pejit(loss, constant_argnums="automatic")
    with pytest.raises(TypeError, match="takes no constant_arg_nums or constant_argnames"):
        pejit(loss, constant_argnums="auto", constant_argnames="X")
    with pytest.raises(TypeError) as theirs:  # jax.jit's error for jax.jit's keywords
        jax.jit(loss, static_argnums="x")
    with pytest.raises(TypeError, match=re.escape(str(theirs.value).splitlines()[0])):
        pejit(loss, constant_argnums="auto", static_argnums="x")


def test_staged_api_is_the_generic_programs_and_cache_clear_forgets():
    f = pejit(loss, constant_argnums="auto", auto_min_flops=0)
    X = data(0)
    for w in ws[:3]:
        f(w, X)
    assert f.eval_shape(ws[0], X) == jax.eval_shape(loss, ws[0], X)
    np.testing.assert_allclose(f.lower(ws[0], X).compile()(ws[1], X), jax.jit(loss)(ws[1], X), rtol=1e-5)
    f.cache_clear()
    assert f.decisions() == {} and tuple(f.cache_info()) == (0, 0, 128, 0)
    assert f.cache_info().promotions == 0
    check(f, ws[0], X)
    assert f.cache_info().generic_calls == 1


def test_the_estimate_sees_static_arguments_values():
    def g(w, X, heavy):
        return loss(w, X) if heavy else jnp.sum(X @ w)

    f = pejit(g, constant_argnums="auto", static_argnums=2)
    X = data(0, n=200, m=100)  # heavy: X.T @ X is 4e6 FLOPs, above the default threshold
    w = jnp.ones(100)
    for k in range(3):
        np.testing.assert_allclose(f(w + k, X, False), jnp.sum(X @ (w + k)), rtol=1e-4)
    assert f.decisions()[1][0] == "kept dynamic"
    h = pejit(g, constant_argnums="auto", static_argnums=2)
    for k in range(3):
        np.testing.assert_allclose(h(w + k, X, True), jax.jit(loss)(w + k, X), rtol=1e-4)
    assert h.decisions()[1][0] == "promoted"



def test_the_estimate_maps_keyword_arguments_by_name():
    def g(w, *, b, a):  # passed b first; jax.jit flattens keywords by name (a, then b)
        return loss(w, b) + jnp.sum(a)

    f = pejit(g, constant_argnums="auto")
    X = data(0, n=200, m=100)  # X.T @ X: 4e6 FLOPs, above the default threshold
    w = jnp.ones(100)
    for k in range(4):
        a = jnp.full(3, float(k))  # changes every call
        np.testing.assert_allclose(f(w + k, b=X, a=a), jax.jit(g)(w + k, b=X, a=a), rtol=1e-4)
    assert f.decisions()["b"][0] == "promoted" and f.decisions()["a"][0] != "promoted"
    assert f.cache_info().misses == 1

def test_a_small_fold_is_promoted_as_one_compiled_program():
    from pejit._fold import _cost, _known

    def one_program(fun) -> bool:  # what a promotion of X, argument 1, asks
        return _cost.one_program_pays(_known.known_work(jax.make_jaxpr(fun)(ws[0], data(0)), [False, True]).folded)

    assert one_program(loss)  # 9 distinct operations: one program beats nine

    def unrolled(w, X):  # many equations, few distinct ones: op by op is cheaper
        for _ in range(200):
            X = jnp.sin(X)
        return jnp.sum(X @ w)

    assert not one_program(unrolled)

    X = data(3, n=40, m=30)
    w = [jnp.full(30, float(i)) for i in range(4)]
    explicit = pejit(loss, constant_argnums=1)
    # not beside the first call: the promotion's fold runs inside the counted call
    for options, most in ((FoldOptions(beside=False), 5), (FoldOptions(backend="eager", beside=False), None)):
        jax.clear_caches()
        f = pejit(loss, constant_argnums="auto", auto_min_flops=0, fold_options=options)
        f(w[0], X)
        expected = explicit(w[1], X)
        with Compiles() as compiles:
            got = f(w[1], X)  # promoted here
        np.testing.assert_allclose(got, expected, rtol=1e-6)
        assert f.decisions()[1][0] == "promoted"
        backends = f.report(w[1], X).fold.backends
        assert (backends == {"compiled": 1}) == (most is not None)  # one compiled batch, or the user's eager
        if most is not None:
            # the fold program and the residual (plus scalar conversions),
            # not one program per primitive of the fold
            assert compiles.count <= most
        else:
            # the user's back end is kept: op by op, the products, the
            # cholesky and the residual each compiled alone
            assert compiles.count > 2
        for v in w[2:]:
            np.testing.assert_allclose(f(v, X), explicit(v, X), rtol=1e-6)


def test_a_new_promoted_object_is_folded_again_with_a_one_program_fold():
    f = pejit(loss, constant_argnums="auto", auto_min_flops=0, auto_demote_after=5)
    X1, X2 = data(4), data(5)
    for X in (X1, X2, X1):
        for w in ws[:3]:
            check(f, w, X)
    info = f.cache_info()
    assert info.promotions == 3 and info.misses == 2  # X1 folded once, X2 once, X1 again a hit
    assert f.decisions()[1][0] == "promoted"


def ridge(w, X, y):
    L = jnp.linalg.cholesky(X.T @ X + 0.1 * jnp.eye(X.shape[1], dtype=X.dtype))
    z = jax.scipy.linalg.solve_triangular(L, X.T @ (X @ w - y), lower=True)
    return jnp.sum(z**2)


@with_f32_products  # against a float64 oracle at 1e-4: on GPUs, TF32 products are off by 1e-4 and more
def test_a_short_affine_region_is_collapsed_without_a_compile_per_primitive():
    # solve_triangular(L, X.T @ (X @ w - y)) is affine in w: its matrix is
    # built at promotion (on the host, or by one compiled program); op by op
    # with JAX, that would compile each of the region's primitives (and
    # their tangents and batches) separately
    rng = np.random.default_rng(7)
    X = jnp.asarray(rng.standard_normal((64, 24)), jnp.float32)
    y = jnp.asarray(rng.standard_normal(64), jnp.float32)
    w = [jnp.asarray(rng.standard_normal(24), jnp.float32) for _ in range(4)]
    jax.clear_caches()
    f = pejit(ridge, constant_argnums="auto", auto_min_flops=0)
    f(w[0], X, y)
    with Compiles() as compiles:
        got = f(w[1], X, y)  # promoted here
    assert f.decisions()[1][0] == "promoted"
    assert f.report(w[1], X, y).fold.collapsed, "the affine region was not collapsed"
    # fold, Jacobian, residual (plus scalar conversions); where values are not
    # in host memory (a GPU's), finding uniform constants runs a program too
    assert compiles.count <= (6 if jax.default_backend() == "cpu" else 8), compiles.where
    oracle = np.asarray(X, np.float64)
    L = np.linalg.cholesky(oracle.T @ oracle + 0.1 * np.eye(24))
    for v in w[1:]:
        z = np.linalg.solve(L, oracle.T @ (oracle @ np.asarray(v, np.float64) - np.asarray(y, np.float64)))
        np.testing.assert_allclose(f(v, X, y), np.sum(z**2), rtol=1e-4)
    np.testing.assert_allclose(got, jax.jit(ridge)(w[1], X, y), rtol=1e-4)


def test_a_process_that_ends_while_auto_watches_its_arguments_says_nothing():
    # the watched arguments die as the interpreter clears the modules; the
    # callback that would watch again then finds them cleared
    code = """
        import jax.numpy as jnp, numpy as np
        from pejit import pejit

        def loss(params, X, y):
            L = jnp.linalg.cholesky(X.T @ X + 0.1 * jnp.eye(X.shape[1]))
            return jnp.sum(jnp.linalg.solve(L, X.T @ (X @ params - y)) ** 2)

        rng = np.random.default_rng(0)
        X, y = jnp.asarray(rng.standard_normal((400, 150))), jnp.asarray(rng.standard_normal(400))
        f = pejit(loss, constant_argnums="auto")
        for i in range(4):
            f(jnp.ones(150) * i, X, y)
        print(f.decisions())
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "promoted" in proc.stdout  # auto folds X and y
    assert "Exception ignored" not in proc.stderr, proc.stderr
