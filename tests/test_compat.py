"""The compatibility layer: a JAX without an internal pejit needs fails at import, clearly."""

import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import pytest

from pejit import _compat


def test_every_needed_internal_is_present_in_this_jax():
    _compat._probe()  # raises ImportError otherwise


def test_a_missing_internal_is_named_with_the_jax_version_and_supported_range():
    module = types.ModuleType("jax._src.core")
    with pytest.raises(ImportError) as caught:
        _compat._probe(required=[(module, "eval_jaxpr", "replaying a jaxpr")], methods={})
    message = str(caught.value)
    assert f"JAX {jax.__version__} lacks what it needs" in message
    assert "pejit supports JAX 0.7.0 to 0.12.x" in message
    assert "jax._src.core.eval_jaxpr (replaying a jaxpr)" in message


def test_an_overridden_method_with_other_parameters_is_named():
    class Trace:
        def process_primitive(self, primitive, tracers):  # no params
            pass

    with pytest.raises(ImportError, match=r"DynamicJaxprTrace\.process_primitive\(primitive, tracers, params\), "
                       r"found \(primitive, tracers\)"):
        _compat._probe(required=[], methods={"process_primitive": ["primitive", "tracers", "params"]},
                       trace_class=Trace)


def test_import_pejit_on_a_jax_without_an_internal_raises_import_error():
    code = (
        "import jax._src.interpreters.partial_eval as pe\n"
        "del pe.move_binders_to_back\n"
        "import pejit\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pejit supports JAX 0.7.0 to 0.12.x"), proc.stderr
    assert "move_binders_to_back (splitting loop bodies)" in last


def test_scan_parameters_round_trip_in_this_jax():
    """Hoisting rebuilds scan's parameters; the scan still evaluates the same."""
    def body(c, x):
        return c + x, c * x

    closed = jax.make_jaxpr(lambda c, xs: jax.lax.scan(body, c, xs))(1.0, jax.numpy.arange(3.0))
    eqn = closed.jaxpr.eqns[0]
    scan = _compat.ScanParams(eqn.params)
    assert (scan.num_consts, scan.num_carry, scan.num_xs) == (0, 1, 1)
    params = scan.with_consts(eqn.params["jaxpr"], 0)
    outs = eqn.primitive.bind(1.0, jax.numpy.arange(3.0), **params)
    ref = jax.lax.scan(body, 1.0, jax.numpy.arange(3.0))
    assert float(outs[0]) == float(ref[0])
    assert outs[1].tolist() == ref[1].tolist()



def test_versions_are_read_by_their_leading_numbers():
    from pejit._compat._versions import release

    assert release("0.11.1.dev20250101") == (0, 11, 1)
    assert release("0.12.0.1") == (0, 12, 0, 1)
    assert release(_compat.JAXLIB_VERSION)[:2] >= (0, 7)


def test_a_jit_call_is_inlined_as_this_jax_marks_it():
    """``inline=True`` is a bool up to JAX 0.10 (which inlines it while tracing) and ``Inline.JAX_LATE`` from 0.11."""
    jaxpr = jax.make_jaxpr(lambda x: jax.jit(jnp.sin, inline=True)(x) + jax.jit(jnp.cos)(x))(1.0)
    calls = [e.params for e in jaxpr.eqns if e.primitive is _compat.jit_p]
    assert [_compat.jit_inlines(p) for p in calls] == [True] * (len(calls) - 1) + [False]
    assert _compat.jit_inlines({"inline": True}) and not _compat.jit_inlines({"inline": False})


def test_cotangent_types_in_this_jax():
    assert _compat.cotangent_aval(jax.typeof(jnp.ones(3, jnp.int32))).dtype == jax.dtypes.float0
    assert _compat.cotangent_aval(jax.typeof(jnp.ones(3))) == jax.typeof(jnp.ones(3))


def test_a_trace_is_called_where_this_jax_calls_one():
    traced = jax.jit(jnp.sin).trace(1.0)
    assert _compat.TRACED_IS_CALLABLE == callable(traced)
    if _compat.TRACED_IS_CALLABLE:
        assert float(traced(1.0)) == float(jnp.sin(1.0))
