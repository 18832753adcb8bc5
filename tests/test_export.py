"""Staging and exporting a pejit function never gives a wrong value (issue 34).

Each staging API of both forms is checked on ``inv(A) @ x`` whose folded
constant, ``inv(A)``, has the shape of the argument ``A``: a jaxpr or a
compiled program that took the one for the other would run without a
shape error and give ``A @ x``. Every program is called with other
dynamic values than it was staged with (and, where it takes the constants,
with other constant values too), and compared with NumPy.
"""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import pejit
from pejit import export_folded, pejit as pj

N = 4
A = jnp.eye(N) * 2.0 + 0.1
A2 = jnp.eye(N) * 3.0 - 0.2
X = jnp.arange(N, dtype=jnp.float32)
X2 = X + 7.0
SPEC_A = jax.ShapeDtypeStruct(A.shape, A.dtype)
SPEC_X = jax.ShapeDtypeStruct(X.shape, X.dtype)


def fun(A, x):
    return jnp.linalg.inv(A) @ x


def want(A, x):
    return np.linalg.inv(np.asarray(A, np.float64)) @ np.asarray(x, np.float64)


def close(got, A, x):
    np.testing.assert_allclose(np.asarray(got, np.float64), want(A, x), rtol=1e-5)


def jaxpr_value(closed, *args):
    (out,) = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *args)
    return out


def called(traced, *args):
    """A trace called as a function (JAX 0.9 and newer); else its jaxpr evaluated."""
    return traced(*args) if callable(traced) else jaxpr_value(traced.jaxpr, *args)


# -- the call-time form ---------------------------------------------------------------


def test_call_time_trace_is_the_function_of_its_arguments():
    f = pj(fun, constant_argnums=0)
    traced = f.trace(A, X)
    assert isinstance(traced, pejit.Traced) and isinstance(traced, jax.stages.Traced)
    assert [a.shape for a in traced.jaxpr.in_avals] == [(N, N), (N,)]  # the user's signature
    close(jaxpr_value(traced.jaxpr, A, X2), A, X2)
    close(called(traced, A, X2), A, X2)
    compiled = traced.lower().compile()
    close(compiled(A, X2), A, X2)
    assert "custom_call" not in traced.lower().as_text()
    for stage in (traced, compiled) if callable(traced) else (compiled,):
        with pytest.raises(ValueError, match="specialized for other constant values"):
            stage(A2, X2)


def test_call_time_lower_and_eval_shape():
    f = pj(fun, constant_argnums=0)
    compiled = f.lower(A, X).compile()
    close(compiled(A, X2), A, X2)
    with pytest.raises(ValueError, match="specialized for other constant values"):
        compiled(A2, X2)
    out = f.eval_shape(A, X)
    assert (out.shape, out.dtype) == ((N,), jnp.float32)


def test_call_time_staging_with_abstract_constants_is_jax_jits():
    f = pj(fun, constant_argnums=0)
    assert f.eval_shape(SPEC_A, SPEC_X) == jax.jit(fun).eval_shape(SPEC_A, SPEC_X)
    traced = f.trace(SPEC_A, SPEC_X)
    close(jaxpr_value(traced.jaxpr, A2, X2), A2, X2)
    close(f.lower(SPEC_A, SPEC_X).compile()(A2, X2), A2, X2)


def test_jax_export_of_the_call_time_form():
    f = pj(fun, constant_argnums=0)
    # concrete constants: the folded program is right for them only, so it raises, naming the way
    with pytest.raises(ValueError, match=r"pejit\.export_folded\(f\)\(\*args\).*jax\.ShapeDtypeStruct"):
        export.export(f)(A, X)
    # constants as types: the unfolded program, right for every value, as jax.jit's
    generic = export.export(f)(SPEC_A, SPEC_X)
    close(generic.call(A2, X2), A2, X2)
    close(export.deserialize(generic.serialize()).call(A, X2), A, X2)


def test_export_folded_of_the_call_time_form():
    f = pj(fun, constant_argnums=0)
    exported = export_folded(f)(A, X)
    assert exported.in_avals == (jax.core.ShapedArray((N,), jnp.float32),)  # the dynamic argument alone
    assert "custom_call" not in exported.mlir_module()
    close(exported.call(X2), A, X2)
    close(export.deserialize(exported.serialize()).call(X2), A, X2)
    close(export_folded(f)(A, SPEC_X).call(X2), A, X2)  # dynamic arguments may be types
    with pytest.raises(ValueError, match="needs the values of the constant arguments"):
        export_folded(f)(SPEC_A, X)


def test_export_folded_keywords_and_statics():
    f = pj(lambda x, n, *, basis: n * (jnp.linalg.inv(basis) @ x), constant_argnames="basis", static_argnums=1)
    exported = export_folded(f)(X, 2, basis=A)
    assert exported.in_avals == (jax.core.ShapedArray((N,), jnp.float32),)
    np.testing.assert_allclose(exported.call(X2), 2 * want(A, X2), rtol=1e-5)
    traced = f.trace(X, 2, basis=A)
    np.testing.assert_allclose(traced.lower().compile()(X2, 2, basis=A), 2 * want(A, X2), rtol=1e-5)
    with pytest.raises(ValueError, match="specialized for other constant values"):
        traced.lower().compile()(X2, 3, basis=A)


def test_trace_of_a_constant_with_static_leaves():
    f = pj(lambda c, x: jnp.linalg.inv(c["A"]) @ x if c["how"] == "inv" else x, constant_argnums=0)
    c = {"A": A, "how": "inv"}
    traced = f.trace(c, X)
    close(traced.lower().compile()(c, X2), A, X2)


def test_jit_and_make_jaxpr_of_the_call_time_form():
    f = pj(fun, constant_argnums=0)
    with pytest.warns(pejit.FoldingSkippedWarning):  # constants traced by jax.jit: nothing to fold
        close(jax.jit(f)(A2, X2), A2, X2)
    close(jaxpr_value(jax.make_jaxpr(f)(A, X), A2, X2), A2, X2)


# -- the TFC form ---------------------------------------------------------------------


def test_tfc_trace_is_a_function_of_the_dynamic_arguments():
    g = pj(A, X, constant_arg_nums=[0])(fun)
    traced = g.trace(X)
    assert isinstance(traced, pejit.Traced)
    assert [a.shape for a in traced.jaxpr.in_avals] == [(N,)]
    close(jaxpr_value(traced.jaxpr, X2), A, X2)
    close(called(traced, X2), A, X2)
    close(traced.lower().compile()(X2), A, X2)
    close(g.lower(X).compile()(X2), A, X2)
    assert g.eval_shape(X).shape == (N,)
    close(jax.jit(g)(X2), A, X2)
    close(jaxpr_value(jax.make_jaxpr(g)(X), X2), A, X2)


def test_jax_export_of_the_tfc_form_is_the_folded_program():
    g = pj(A, X, constant_arg_nums=[0])(fun)
    exported = export.export(g)(X)
    assert exported.in_avals == (jax.core.ShapedArray((N,), jnp.float32),)
    assert "custom_call" not in exported.mlir_module()
    close(exported.call(X2), A, X2)
    close(export.export(g)(SPEC_X).call(X2), A, X2)
    assert export_folded(g)(X).in_avals == exported.in_avals
    # the exported VJP is the folded program's too
    back = export.deserialize(exported.serialize(vjp_order=1))
    grad = jax.grad(lambda x: back.call(x).sum())(X2)
    np.testing.assert_allclose(grad, np.linalg.inv(np.asarray(A)).T @ np.ones(N), rtol=1e-5)


def test_deserialized_in_a_process_without_pejit(tmp_path):
    g = pj(A, X, constant_arg_nums=[0])(fun)
    path = tmp_path / "g.bin"
    path.write_bytes(export.export(g)(X).serialize())
    code = (
        "import sys, jax.numpy as jnp, numpy as np; from jax import export\n"
        f"e = export.deserialize(bytearray(open({str(path)!r}, 'rb').read()))\n"
        f"print(np.asarray(e.call(jnp.arange({N}.0) + 7.0)).tolist()); assert 'pejit' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    close(np.array(eval(proc.stdout)), A, X2)


# -- without constants, and the forms export_folded refuses ----------------------------


def test_without_constants_staging_is_jax_jits():
    h = pj(fun)
    close(export.export(h)(A, X).call(A2, X2), A2, X2)
    close(jaxpr_value(h.trace(A, X).jaxpr, A2, X2), A2, X2)
    close(h.lower(A, X).compile()(A2, X2), A2, X2)
    close(export_folded(h)(A, X).call(A2, X2), A2, X2)


def test_export_folded_refuses_what_it_cannot_fold():
    with pytest.raises(TypeError, match="constant_argnums='auto'"):
        export_folded(pj(fun, constant_argnums="auto"))
    with pytest.raises(TypeError, match="made by pejit or pe"):
        export_folded(jax.jit(fun))
