"""explain() and the FoldReport views: what was folded, in numbers and pictures."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pejit import FoldOptions, FoldReport, explain, pe, pejit, specialize_jaxpr
from ._util import requires_jax, with_f32_products


def inv_chol(A, x):
    return jnp.linalg.inv(A) @ x + jnp.linalg.cholesky(A @ A.T) @ x


A = jnp.asarray(3 * np.eye(8) + np.random.default_rng(0).standard_normal((8, 8)) / 8, jnp.float32)
X = jnp.ones(8)


@pytest.fixture(scope="module")
def report() -> FoldReport:
    # The views of a residual of several equations: by default the two
    # products collapse into one (see test_collapsed_regions_are_reported).
    return explain(inv_chol, A, X, constant_argnums=0, fold_options=FoldOptions(affine=False))


def test_counts_and_constants(report):
    assert report.residual == {"dot_general": 2, "add": 1}
    assert report.folded_eqns > 0 and report.residual_eqns == 3
    # inv(A) and cholesky(A A^T) reach the program as two device buffers.
    assert [(a.shape, a.dtype) for a in report.buffers] == [((8, 8), jnp.float32)] * 2
    assert report.folded_bytes == 2 * 8 * 8 * 4
    assert report.literals == []
    # A value-independent structure: its known work is one batch, staged
    # into the folding program.
    assert report.backends == {"program": 1}
    assert sum(b.equations for b in report.batches) == report.folded_eqns
    assert str(report).splitlines()[3].endswith("(1 batch: 1 program)")
    assert report.fold_seconds > 0
    assert report.warnings == []


def test_before_is_the_unfolded_program(report):
    # What jax.jit would compile with A closed over: A is a const, x the input.
    before = report.before
    assert [c.shape for c in before.consts] == [(8, 8)]
    assert [v.aval.shape for v in before.jaxpr.invars] == [(8,)]
    names = [e.primitive.name for e in before.jaxpr.eqns]
    assert names == [e.primitive.name for e in jax.make_jaxpr(inv_chol)(A, X).eqns]
    # Everything on A is folded; the two products with x and their sum are not.
    marks = dict(zip(range(len(names)), report.marks))
    residual = [n for i, n in enumerate(names) if marks[i] == "residual"]
    assert residual == ["dot_general", "dot_general", "add"]
    np.testing.assert_allclose(jax.extend.core.jaxpr_as_fun(before)(X)[0], inv_chol(A, X), rtol=1e-5)


def test_flops_estimate(report):
    n = 8
    # LU (2/3 n^3) + two triangular solves (2 n^3) + A A^T (2 n^3) + Cholesky (n^3/3) at least.
    assert report.flops_removed >= 2 * n**3
    assert report.flops_residual == 2 * (2 * n * n) + n  # two mat-vecs and an add


def test_str_is_a_short_summary(report):
    text = str(report)
    assert 3 <= len(text.splitlines()) <= 8
    assert "residual 3 equations" in text
    assert "2 buffers, 512 bytes" in text
    assert "FLOPs" in text


def test_html_marks_folded_equations(report):
    page = report._repr_html_()
    assert page.count("# folded") == report.marks.count("folded")
    assert "before" in page and "after" in page
    assert "dot_general" in page


def test_dot_colours_every_equation(report):
    dot = report.to_dot()
    assert dot.startswith('digraph "pejit" {') and dot.rstrip().endswith("}")
    nodes = [line for line in dot.splitlines() if line.lstrip().startswith("e") and "[" in line]
    assert len(nodes) == len(report.before.jaxpr.eqns)
    assert sum("#b7e1cd" in n for n in nodes) == report.marks.count("folded")
    assert sum("#f9cb9c" in n for n in nodes) == 3


def test_python_control_flow_and_masks_on_constants():
    def f(c, y):
        if c.sum() > 0:  # concrete while tracing
            y = y + c[c > 1.5].sum()
        return y * jnp.broadcast_to(c[0], (300,)).sum()

    c = jnp.arange(3.0)
    r = explain(f, c, jnp.float32(1.0), constant_argnums=0)
    assert "residual" in r.marks and "folded" in r.marks
    assert all(e.primitive.name != "gt" for e in r.after.jaxpr.eqns)
    # The report's "before" computes what the function computes.
    np.testing.assert_allclose(jax.extend.core.jaxpr_as_fun(r.before)(2.0)[0], f(c, 2.0))


def test_boolean_mask_from_lazy_expansion():
    # A large broadcast of a constant stays lazy (recomputed, not stored);
    # using it as a boolean mask needs its value as a NumPy array.
    def f(c, y):
        return y[jnp.broadcast_to(c, (1000,)) > 0].sum()

    assert float(pejit(f, constant_argnums=0)(jnp.float32(1.0), jnp.ones(1000))) == 1000.0


@requires_jax((0, 8), "jax.debug.print stages a debug_callback equation, not debug_print")
def test_effects_are_reported():
    def f(c, y):
        jax.debug.print("c = {}", c)
        return c * y

    r = explain(f, jnp.float32(2.0), jnp.float32(3.0), constant_argnums=0)
    assert r.effects_kept == {"debug_print": 1}
    assert "effect" in r.marks
    assert any("debug_print" in w for w in r.warnings)


def test_pejit_functions_are_explained_with_their_own_constants():
    f = pejit(inv_chol, constant_argnums=0)
    f(A, X)
    r = explain(f, A, X)
    assert r.residual == {"dot_general": 1}  # (inv(A) + cholesky(A A^T)) @ x
    assert r is not f.report(A, X) and r.after is f.report(A, X).after  # cached specialization
    g = pe(A, X, constant_arg_nums=[0])(inv_chol)
    assert explain(g, X).residual == {"dot_general": 1}
    with pytest.raises(TypeError, match="already knows its constant arguments"):
        explain(f, A, X, constant_argnums=0)


@with_f32_products  # the values against float64 NumPy
def test_collapsed_regions_are_reported():
    r = explain(inv_chol, A, X, constant_argnums=0)
    assert r.residual == {"dot_general": 1} and r.folded_bytes == 8 * 8 * 4
    (c,) = r.collapsed
    assert (c.eqns, c.inputs, c.outputs) == (3, 8, 8)
    assert (c.flops_before, c.flops_after, c.bytes_stored) == (2 * 2 * 8 * 8 + 8, 2 * 8 * 8, 8 * 8 * 4)
    assert f"affine region collapsed: {c}" in str(r).splitlines()
    np.testing.assert_allclose(
        pejit(inv_chol, constant_argnums=0)(A, X),
        (np.linalg.inv(np.float64(A)) + np.linalg.cholesky(np.float64(A) @ np.float64(A).T)) @ np.float64(X),
        rtol=1e-5,
    )


def test_explain_accepts_abstract_dynamic_arguments_and_names():
    def f(x, *, basis):
        return basis @ x

    r = explain(f, jax.ShapeDtypeStruct((3,), jnp.float32), basis=jnp.eye(3), constant_argnames="basis")
    assert r.residual == {"dot_general": 1}


def test_bad_constant_argnums_name_the_argument():
    with pytest.raises((ValueError, TypeError), match="constant_argnums"):
        explain(inv_chol, A, X, constant_argnums=5)


def test_specialize_jaxpr_report_marks_known_inputs():
    cj = jax.make_jaxpr(lambda a, x: jnp.sin(a) * x)(1.0, 2.0)
    spec = specialize_jaxpr(cj, known={0: 1.0})
    assert spec.report.known_invars == (0,)
    assert spec.report.marks == ["folded", "residual"]
    assert 'constant 0: f32[]' in spec.report.to_dot()


# -- consistency of the views (issue 14) ----------------------------------------------
def _flops_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("estimated FLOPs per call:"))


def test_report_and_explain_print_the_same_fields():
    f = pejit(inv_chol, constant_argnums=0)
    short, full = str(f.report(A, X)), str(explain(f, A, X))
    assert short == full
    assert _flops_line(short) == _flops_line(str(explain(inv_chol, A, X, constant_argnums=0)))
    assert f.report(A, X).flops_removed >= 2 * 8**3


def test_nested_calls_are_counted_by_name():
    r = pejit(inv_chol, constant_argnums=0).report(A, X)
    names = set(r.folded)
    assert "jit" not in names
    assert {"jit(inv)", "jit(cholesky)"} <= names, names
    assert "jit(inv) x1" in str(r) and "jit(cholesky) x1" in str(r)
    assert 'label="jit(cholesky)\\n' in explain(inv_chol, A, X, constant_argnums=0).to_dot()


def _depends_on_constants_only(closed) -> list[str]:
    """Primitives of the residual whose inputs are all folded constants or literals."""
    known = set(closed.jaxpr.constvars)
    out = []
    for e in closed.jaxpr.eqns:
        if all(isinstance(v, jax.extend.core.Literal) or v in known for v in e.invars):
            known.update(e.outvars)
            out.append(e.primitive.name)
    return out


@pytest.mark.parametrize("fun, c, y", [
    (lambda c, y: jnp.ones((1024, 1024)) * c + y, jnp.float32(2.0), jnp.ones((1024, 1024))),
    (lambda c, y: jnp.arange(1024.0 * 1024).reshape(1024, 1024) * c + y, jnp.float32(2.0), jnp.ones((1024, 1024))),
    (inv_chol, A, X),
], ids=["broadcast", "iota", "no expansion"])
def test_recomputed_expansions_note_states_the_residual(fun, c, y):
    r = pejit(fun, constant_argnums=0).report(c, y)
    recomputed = _depends_on_constants_only(r.after)
    assert sorted(r.rematerialized.elements()) == sorted(recomputed)
    notes = [w for w in r.warnings if w.startswith("cheap expansions recomputed")]
    if recomputed:
        (note,) = notes
        for name in set(recomputed):
            assert f"{name} x{recomputed.count(name)}" in note
        assert all(name in recomputed for name in r.rematerialized)
    else:
        assert notes == []


def test_dot_graph_has_a_legend():
    dot = explain(inv_chol, A, X, constant_argnums=0).to_dot()
    legend = dot[dot.index("subgraph cluster_legend"):]
    for text in ("input (dynamic)", "constant", "folded (computed once)", "residual (runs every call)",
                 "effect kept"):
        assert f'label="{text}' in legend
    for color in ("#b7e1cd", "#f9cb9c", "#ea9999"):  # the colours the equations use
        assert color in legend
@pytest.mark.parametrize("backend", ["eager", "compiled"])
def test_batches_report_how_known_work_was_evaluated(backend):
    def f(A, x):  # Python control flow on A: folded per value, in batches
        B = jnp.sin(A) * 2.0 + 1.0 if A.sum() > 0 else A
        return B @ x

    r = explain(f, A, X, constant_argnums=0, fold_options=FoldOptions(backend=backend))
    assert set(r.backends) == {backend}
    assert f"{r.backends[backend]} {backend}" in str(r)
