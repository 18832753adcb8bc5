"""The persistent cache of folded constants (pejit._calls._persist): keys, hits, faults, CLI."""

import contextlib
import errno
import io
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pejit import FoldOptions, PersistentCacheWarning, pejit
from pejit._calls import _jaxpr_json, _persist, _specializer
from pejit._demo import main as cli
from pejit._calls._persist import Store

READ = "read from the persistent cache"


def solve(A, x):
    return jnp.linalg.inv(A) @ x + jnp.sin(A).sum(0) * x


def other_solve(A, x):
    return jnp.linalg.inv(A) @ x + jnp.cos(A).sum(0) * x


A = np.arange(16.0, dtype=np.float32).reshape(4, 4) / 10 + 3 * np.eye(4, dtype=np.float32)
X = np.linspace(0.0, 1.0, 4, dtype=np.float32)


def call(fun, where, A=A, *, form="jit", options=FoldOptions()):
    """(result, whether the constants came from the cache) of a new pejit function."""
    options = FoldOptions(**{**options.__dict__, "cache_dir": str(where)})
    A = jnp.asarray(A)
    if form == "tfc":
        f = pejit(A, X, constant_arg_nums=[0], fold_options=options)(fun)
        out, spec = f(X), f.specialize(X)
    else:
        f = pejit(fun, constant_argnums=0, fold_options=options)
        out, spec = f(A, X), f.specialize(A, X)
    return np.asarray(out), any(READ in note for note in spec.report.fallbacks)


def entries(where):
    return Store(where).entries()


@pytest.mark.parametrize("form", ["jit", "tfc"])
def test_second_function_reads_what_the_first_folded(tmp_path, form, monkeypatch):
    want = np.asarray(jax.jit(solve)(A, X))
    out, hit = call(solve, tmp_path, form=form)
    assert not hit and len(entries(tmp_path)) == 1
    np.testing.assert_allclose(out, want, rtol=1e-5)

    def no_folding(*args, **kwargs):
        raise AssertionError("folded on a hit")

    for module, name in ((_persist, "specialize_jaxpr"), (_specializer, "fold"), (_specializer, "trace_program")):
        monkeypatch.setattr(module, name, no_folding)
    out, hit = call(solve, tmp_path, form=form)
    assert hit
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_a_hit_composes_with_grad_and_vmap(tmp_path):
    call(solve, tmp_path)
    f = pejit(solve, constant_argnums=0, fold_options=FoldOptions(cache_dir=str(tmp_path)))
    Aj = jnp.asarray(A)
    assert READ in " ".join(f.report(Aj, X).fallbacks)
    xs = np.stack([X, 2 * X])
    np.testing.assert_allclose(jax.vmap(f, (None, 0))(Aj, xs), jax.vmap(solve, (None, 0))(A, xs), rtol=1e-5)
    grad = jax.grad(lambda x: f(Aj, x).sum())(X)
    np.testing.assert_allclose(grad, jax.grad(lambda x: solve(A, x).sum())(X), rtol=1e-5)


@pytest.mark.parametrize("change", ["body", "element", "dtype", "options"])
def test_each_part_of_the_key_misses(tmp_path, change):
    base = np.round(A * 10)  # integers: the same values in int32
    call(solve, tmp_path, base)
    fun, a, options = solve, base, FoldOptions()
    if change == "body":
        fun = other_solve
    elif change == "element":
        a = base.copy()
        a[2, 1] += 1
    elif change == "dtype":
        a = base.astype(np.int32)
    else:
        options = FoldOptions(literals=False)
    out, hit = call(fun, tmp_path, a, options=options)
    assert not hit and len(entries(tmp_path)) == 2
    np.testing.assert_allclose(out, jax.jit(fun)(jnp.asarray(a), X), rtol=1e-5)


def closing_over(c):
    """A function whose constant hides in a called jaxpr: ``jax.jit`` keeps
    the closed-over array as that jaxpr's constant, not the trace's."""
    inner = jax.jit(lambda x: x * c)
    return lambda A, x: inner(x) + A.sum(0)


def test_constants_of_called_jaxprs_are_in_the_key(tmp_path):
    for c in (np.full(4, 1.0, np.float32), np.full(4, 5.0, np.float32)):
        fun = closing_over(c)
        out, hit = call(fun, tmp_path)
        assert not hit
        np.testing.assert_allclose(out, jax.jit(fun)(A, X), rtol=1e-6)
    assert len(entries(tmp_path)) == 2


def many_parts(A, x):
    """Calls, branches, loops, a differentiation rule and literals in one trace."""
    y = jax.nn.relu(A) @ x
    y = jax.lax.cond(x[0] > 0, lambda y: y * 2, lambda y: y - 1, y)
    y = jax.lax.scan(lambda s, _: (s * 0.5 + jnp.arange(4.0), None), y, None, length=3)[0]
    return jnp.sum(y, axis=0) + jax.jit(lambda q: q + np.arange(4.0, dtype=np.float32))(x)


def test_the_key_is_the_same_in_every_process():
    code = textwrap.dedent(f"""
        import sys
        import jax, numpy as np
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_persist import A, X, many_parts
        from pejit import FoldOptions
        from pejit._calls import _persist
        print(_persist.key(FoldOptions(), (0,), jax.make_jaxpr(many_parts)(A, X), None, [A]))
    """)
    keys = set()
    for seed in ("1", "2"):  # string hashes, hence set orders, differ
        proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONHASHSEED=seed),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        keys.add(proc.stdout.split()[-1])
    here = _persist.key(FoldOptions(), (0,), jax.make_jaxpr(many_parts)(A, X), None, [A])
    assert keys == {here}
    assert here == _persist.key(FoldOptions(), (0,), jax.make_jaxpr(many_parts)(A, 2 * X), None, [A])  # same types
    assert here != _persist.key(FoldOptions(), (0,), jax.make_jaxpr(many_parts)(A, X), None, [2 * A])
    assert here != _persist.key(FoldOptions(), (0,), jax.make_jaxpr(solve)(A, X), None, [A])


def test_value_dependent_and_callback_functions_are_not_stored(tmp_path):
    def branchy(A, x):
        return x * 2 if A.sum() > 0 else x

    def callback(A, x):
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(A.shape, A.dtype), A).sum(0) * x

    for fun in (branchy, callback):
        out, _ = call(fun, tmp_path)
        np.testing.assert_allclose(out, fun(A, X), rtol=1e-5)
    assert entries(tmp_path) == []


def test_directory_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv(_persist.ENV_DIR, raising=False)
    assert _persist.cache_dir(FoldOptions()) is None  # off by default
    previous = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
        assert _persist.cache_dir(FoldOptions()) == tmp_path / "jax" / "pejit"
        monkeypatch.setenv(_persist.ENV_DIR, str(tmp_path / "env"))
        assert _persist.cache_dir(FoldOptions()) == tmp_path / "env"
        assert _persist.cache_dir(FoldOptions(cache_dir=str(tmp_path / "fn"))) == tmp_path / "fn"
        assert _persist.cache_dir(FoldOptions(cache_dir=False)) is None
    finally:
        jax.config.update("jax_compilation_cache_dir", previous)


def _only_entry(where):
    (entry,) = entries(where)
    return entry.path


@pytest.mark.parametrize("fault", ["truncated", "flipped", "manifest", "no_manifest"])
def test_a_damaged_entry_folds_again_with_one_warning(tmp_path, fault):
    want, _ = call(solve, tmp_path)
    path = _only_entry(tmp_path)
    array = path / "c0.npy"
    if fault == "truncated":
        array.write_bytes(array.read_bytes()[:-7])
    elif fault == "flipped":
        data = bytearray(array.read_bytes())
        data[-1] ^= 1
        array.write_bytes(bytes(data))
    elif fault == "manifest":
        (path / "manifest.json").write_text('{"format": 1, "key": ')
    else:
        (path / "manifest.json").unlink()
    with pytest.warns(PersistentCacheWarning, match=str(path)) as caught:
        out, hit = call(solve, tmp_path)
    assert len(caught) == 1 and not hit
    np.testing.assert_array_equal(out, want)
    assert call(solve, tmp_path)[1]  # written again


def test_unwritable_directory_or_full_disk_warns_and_folds(tmp_path, monkeypatch):
    want = np.asarray(jax.jit(solve)(A, X))
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.warns(PersistentCacheWarning, match=str(blocked)):
        out, _ = call(solve, blocked)
    np.testing.assert_allclose(out, want, rtol=1e-5)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np.lib.format, "write_array", full)
    with pytest.warns(PersistentCacheWarning, match="No space left"):
        out, _ = call(solve, tmp_path)
    np.testing.assert_allclose(out, want, rtol=1e-5)
    assert entries(tmp_path) == [] and list(tmp_path.glob(".tmp-*")) == []


def test_least_recently_used_entries_go_over_the_cap(tmp_path):
    store = Store(tmp_path, max_bytes=3000)
    manifest = {"name": "f", "residual": {}, "stats": {}}
    for i, key in enumerate("abc"):
        store.save(key, manifest, [np.zeros(128)])  # ~1.2 kB each
        os.utime(tmp_path / key / "manifest.json", (i, i))
    assert [e.key for e in store.entries()] == ["b", "c"]
    store.save("b", manifest, [np.zeros(128)])  # already there: the first writer wins
    assert [e.key for e in store.entries()] == ["b", "c"] and list(tmp_path.glob(".tmp-*")) == []


def test_cli_lists_and_clears(tmp_path):
    call(solve, tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["cache", "list", "--dir", str(tmp_path)]) == 0
    assert "solve" in out.getvalue() and "1 entries" in out.getvalue()
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli(["cache", "clear", "--dir", str(tmp_path)]) == 0
    assert entries(tmp_path) == []


def test_jaxpr_json_round_trips_enums_and_named_tuples():
    def f(x, idx):
        y = jax.lax.dot(x, x.T, precision=jax.lax.Precision.HIGHEST)
        return y[idx] + jnp.round(x, 1).astype(jnp.float16).astype(jnp.float32).sum()

    closed = jax.make_jaxpr(f)(jnp.ones((3, 3)), jnp.array([0, 2]))
    doc = json.loads(json.dumps(_jaxpr_json.encode(closed.jaxpr)))
    again = _jaxpr_json.decode(doc)
    assert [e.primitive for e in again.eqns] == [e.primitive for e in closed.jaxpr.eqns]
    x = jnp.arange(9.0).reshape(3, 3)
    run = jax.extend.core.jaxpr_as_fun(jax.extend.core.ClosedJaxpr(again, ()))
    np.testing.assert_array_equal(run(x, jnp.array([0, 2]))[0], f(x, jnp.array([0, 2])))


def test_concurrent_writers_then_a_reader(tmp_path):
    code = textwrap.dedent(f"""
        import json, sys
        import jax.numpy as jnp, numpy as np
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_persist import A, X, READ, solve
        from pejit import pejit
        f = pejit(solve, constant_argnums=0)
        out = f(jnp.asarray(A), X)
        notes = f.report(jnp.asarray(A), X).fallbacks
        print(json.dumps({{"out": np.asarray(out).tolist(), "hit": any(READ in n for n in notes)}}))
    """)
    env = dict(os.environ, PEJIT_CACHE_DIR=str(tmp_path))

    def start():
        return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def result(proc):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])

    writers = [start(), start()]
    results = [result(p) for p in writers]
    reader = result(start())
    want = np.asarray(jax.jit(solve)(A, X))
    for r in (*results, reader):
        np.testing.assert_allclose(r["out"], want, rtol=1e-5)
    assert reader["hit"] and len(entries(tmp_path)) == 1 and list(tmp_path.glob(".tmp-*")) == []


def test_new_values_of_a_structure_use_the_folding_program(tmp_path):
    f = pejit(solve, constant_argnums=0, fold_options=FoldOptions(cache_dir=str(tmp_path)))
    values = [jnp.asarray(A + i) for i in range(3)]
    for a in values:
        np.testing.assert_allclose(f(a, X), jax.jit(solve)(a, X), rtol=1e-5)
    assert f.specialize(values[2], X).program.folding_program is not None
    assert len(entries(tmp_path)) == 3
    g = pejit(solve, constant_argnums=0, fold_options=FoldOptions(cache_dir=str(tmp_path)))
    for a in values:
        assert READ in " ".join(g.report(a, X).fallbacks)
        np.testing.assert_allclose(g(a, X), jax.jit(solve)(a, X), rtol=1e-5)


def test_pytree_keyword_and_static_constants_under_pe(tmp_path):
    from pejit import pe

    def f(x, params, *, mode, scale):
        y = jnp.linalg.inv(params["A"]) @ x + params["b"]
        return (jnp.tanh(y) if mode == "tanh" else y) * scale

    params = {"A": jnp.asarray(A), "b": jnp.arange(4.0)}
    scale = jnp.asarray(2.0)
    want = {m: np.asarray(f(X, params, mode=m, scale=scale)) for m in ("tanh", "id")}
    for expect_hit in (False, True):
        for m in ("tanh", "id"):
            g = pe(f, constant_argnums=1, constant_argnames=("mode", "scale"),
                   fold_options=FoldOptions(cache_dir=str(tmp_path)))
            np.testing.assert_allclose(g(X, params, mode=m, scale=scale), want[m], rtol=1e-5)
            assert (READ in " ".join(g.report(X, params, mode=m, scale=scale).fallbacks)) == expect_hit
    assert len(entries(tmp_path)) == 2


def test_a_stored_residual_cannot_name_code():
    closed = jax.make_jaxpr(lambda x: jnp.round(x, 1))(jnp.ones(3))
    doc = _jaxpr_json.encode(closed.jaxpr)
    params = doc["eqns"][0]["params"]
    assert _jaxpr_json.decode(json.loads(json.dumps(doc))).eqns[0].primitive.name == "jit"
    params["ctx_mesh"] = {"obj": "jax.numpy:sin"}
    with pytest.raises(ValueError, match="not a data object"):
        _jaxpr_json.decode(doc)
    params["ctx_mesh"] = {"obj": "os:system"}
    with pytest.raises(ValueError, match="not a loaded jax module"):
        _jaxpr_json.decode(doc)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.int4, jnp.uint4])
def test_constants_of_ml_dtypes_round_trip(tmp_path, dtype):
    """.npy writes bfloat16, float8 and int4 as raw bytes ("V1", "V2"): a hit
    reads them back as their own dtype, not as bytes or as a sibling type of
    the same size."""
    def fun(W, x):
        return (W + W) * x

    low = 0 if jnp.issubdtype(dtype, jnp.unsignedinteger) else -2  # (no negative uint4)
    W = np.arange(low, low + 4, dtype=np.float32).reshape(2, 2).astype(dtype)
    x = np.ones(2, dtype)
    want = np.asarray(jax.jit(fun)(W, x))
    options = FoldOptions(cache_dir=str(tmp_path))
    for expect_hit in (False, True):
        f = pejit(fun, constant_argnums=0, fold_options=options)
        out, spec = f(W, x), f.specialize(W, x)
        assert any(READ in note for note in spec.report.fallbacks) == expect_hit
        assert [np.asarray(c).dtype for c in spec.consts] == [np.dtype(dtype)]
        assert out.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(out), want)
