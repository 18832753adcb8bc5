"""Random programs: pejit agrees with ``jax.jit`` on programs Hypothesis writes.

A program is a small DAG over float32 vectors of one shape, mixing
elementwise ops, reductions, ``dot``, indexing (static, gather, dynamic
slices, ``.at[].set``), ``lax.cond``, ``lax.scan``, ``fori_loop`` and
``lax.while_loop`` (whose bodies close over other values of the program, so
loop-invariant work exists). Each of its inputs is randomly known (constant)
or unknown (dynamic).

For every program we check, against one ``jax.jit`` compilation of the
reference (the function with the known inputs passed as ordinary
arguments):

* the values of ``pe(f, constant_argnums=known)``;
* ``jax.grad`` of the sum of its outputs with respect to the dynamic inputs
  (``jax.jvp`` where reverse mode does not apply, i.e. through a
  ``while_loop`` with a dynamic carry);
* ``jax.vmap`` over a batch of two values of every dynamic input.

The reference and ``pe`` (the unjitted form) are traced into one ``jax.jit``
so that each program costs one XLA compilation (compilation dominates the
run time); the folding itself happens eagerly, with the known inputs
concrete, exactly as in ``pejit``. ``test_pejit_matches_pe`` checks the
jitted form, standalone, on a sample.

Tolerance: ``rtol=RTOL, atol=ATOL * max(1, max|ref|)``, since folded values
are computed op by op while XLA fuses the reference (see
``docs/numerics.md``). The run is derandomized: the same ``EXAMPLES``
programs every CI run.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

from pejit import pe, pejit

#: CI runs 500; ``.ci/run`` runs fewer against the oldest supported JAX.
EXAMPLES = int(os.environ.get("PEJIT_RANDOM_EXAMPLES", 500))
RTOL = 1e-4
ATOL = 1e-5
N = 4  # every value of a program is a float32[N]
# Compile time dominates; these programs are tiny, so optimizing them buys nothing.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}

UNARY = {
    "sin": jnp.sin,
    "cos": jnp.cos,
    "tanh": jnp.tanh,
    "half": lambda x: 0.5 * x,
    "abs": jnp.abs,
    "gauss": lambda x: jnp.exp(-x * x),
    "log1p_sq": lambda x: jnp.log1p(x * x),
    "sigmoid": jax.nn.sigmoid,
    "cumsum": lambda x: jnp.tanh(jnp.cumsum(x)),
    "sort": jnp.sort,
}
BINARY = {
    "add": jnp.add,
    "sub": jnp.subtract,
    "mul": lambda a, b: jnp.tanh(a * b),
    "max": jnp.maximum,
    "min": jnp.minimum,
    "where": lambda a, b: jnp.where(a > b, a, b * 0.5),
    "hypot": lambda a, b: jnp.sqrt(a * a + b * b + 1.0),
}


def _op_unary(name, a):
    return UNARY[name](a)


def _op_binary(name, a, b):
    return BINARY[name](a, b)


def _op_reduce(kind, a):
    r = {"sum": jnp.sum, "mean": jnp.mean, "max": jnp.max, "norm": jnp.linalg.norm}[kind](a)
    return jnp.tanh(r) * jnp.ones(N, a.dtype)


def _op_dot(a, b, c):
    return jnp.tanh(jnp.outer(a, b) @ c * 0.25) + jnp.dot(a, c) * 0.1


def _op_index(kind, perm, a, b):
    if kind == "perm":
        return a[np.asarray(perm)]
    if kind == "rev":
        return a[::-1] + b
    if kind == "roll":
        return jnp.roll(a, 1) * b
    if kind == "take":  # gather with computed indices
        return jnp.take(a, jnp.argsort(b))
    if kind == "dynamic_slice":
        i = jnp.argmax(b) % (N // 2)
        part = lax.dynamic_slice(a, (i,), (N // 2,))
        return jnp.concatenate([part, part[::-1]])
    if kind == "set":
        return a.at[perm[0]].set(b[perm[1]])
    raise AssertionError(kind)


def _op_cond(u1, u2, a, b, c):
    return lax.cond(jnp.sum(a) > jnp.sum(b), lambda x, y: UNARY[u1](x) + y,
                    lambda x, y: UNARY[u2](y) - x, c, b)


def _op_scan(u, a, b, c, d):
    def body(carry, x):
        new = jnp.tanh(carry * x + UNARY[u](d))  # d is loop-invariant
        return new, jnp.sum(new)

    carry, ys = lax.scan(body, a, jnp.stack([b, c, a]))
    return carry + jnp.mean(ys)


def _op_fori(u, a, b):
    return lax.fori_loop(0, 3, lambda i, x: x * 0.9 + UNARY[u](b) * 0.1, a)


def _op_while(u, a, b):
    def cond(state):
        i, x = state
        return (i < 3) & (jnp.sum(x) < 20.0)

    def body(state):
        i, x = state
        return i + 1, jnp.tanh(x) + UNARY[u](b)

    return lax.while_loop(cond, body, (0, a))[1]


OPS = {
    "unary": (_op_unary, 1),
    "binary": (_op_binary, 2),
    "reduce": (_op_reduce, 1),
    "dot": (_op_dot, 3),
    "index": (_op_index, 2),
    "cond": (_op_cond, 3),
    "scan": (_op_scan, 4),
    "fori": (_op_fori, 2),
    "while": (_op_while, 2),
}


@st.composite
def programs(draw):
    n_in = draw(st.integers(1, 4))
    known = tuple(draw(st.lists(st.booleans(), min_size=n_in, max_size=n_in)))
    ops = []
    for k in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(sorted(OPS)))
        _, arity = OPS[kind]
        operands = tuple(draw(st.integers(0, n_in + k - 1)) for _ in range(arity))
        if kind == "unary":
            static = (draw(st.sampled_from(sorted(UNARY))),)
        elif kind == "binary":
            static = (draw(st.sampled_from(sorted(BINARY))),)
        elif kind == "reduce":
            static = (draw(st.sampled_from(["sum", "mean", "max", "norm"])),)
        elif kind == "index":
            static = (draw(st.sampled_from(["perm", "rev", "roll", "take", "dynamic_slice", "set"])),
                      tuple(draw(st.permutations(range(N)))))
        elif kind == "cond":
            static = tuple(draw(st.sampled_from(sorted(UNARY))) for _ in range(2))
        elif kind in ("scan", "fori", "while"):
            static = (draw(st.sampled_from(sorted(UNARY))),)
        else:
            static = ()
        ops.append((kind, static, operands))
    n_values = n_in + len(ops)
    extra = draw(st.lists(st.integers(0, n_values - 1), max_size=2))
    outputs = tuple(dict.fromkeys([n_values - 1, *extra]))
    seed = draw(st.integers(0, 2**16))
    return {"n_in": n_in, "known": known, "ops": tuple(ops), "outputs": outputs, "seed": seed}


def run(program, *inputs):
    values = list(inputs)
    for kind, static, operands in program["ops"]:
        fn, _ = OPS[kind]
        values.append(fn(*static, *[values[i] for i in operands]))
    return tuple(values[i] for i in program["outputs"])


def _inputs(program, batch=None):
    r = np.random.default_rng(program["seed"])
    shape = (N,) if batch is None else (batch, N)
    return [jnp.asarray(r.uniform(-1.5, 1.5, shape), jnp.float32) for _ in range(program["n_in"])]


def _close(got, want, what):
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    assert got_tree == want_tree, what
    for g, w in zip(got_leaves, want_leaves):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, g, w)
        scale = max(1.0, float(np.max(np.abs(w), initial=0.0)))
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL * scale, err_msg=what)


def check(program):
    f = functools.partial(run, program)
    known = tuple(i for i, k in enumerate(program["known"]) if k)
    args = _inputs(program)
    batched = _inputs(dict(program, seed=program["seed"] + 1), batch=2)
    const_args = [a for a, k in zip(args, program["known"]) if k]
    dyn_args = [a for a, k in zip(args, program["known"]) if not k]
    dyn_batched = [b for b, k in zip(batched, program["known"]) if not k]
    folded = pe(lambda *a: f(*a), constant_argnums=known)

    def merge(const, dyn):
        it, cs = iter(dyn), iter(const)
        return [next(cs) if k else next(it) for k in program["known"]]

    def transforms(g, dyn, dyn_b, use_grad):
        """Value, grad (or jvp) of the total, and vmap of ``g``."""
        if not dyn:
            return g(), (), ()

        def total(*d):
            return sum(jnp.sum(o) for o in g(*d))

        if use_grad:
            deriv = jax.grad(total, argnums=tuple(range(len(dyn))))(*dyn)
        else:
            deriv = jax.jvp(total, tuple(dyn), tuple(jnp.ones_like(d) for d in dyn))
        return g(*dyn), deriv, jax.vmap(g)(*dyn_b)

    def both(const, dyn, dyn_b, use_grad):
        # The reference sees the known inputs as ordinary (traced) arguments;
        # pejit's side sees them as concrete constants (closed over).
        want = transforms(lambda *d: f(*merge(const, d)), dyn, dyn_b, use_grad)
        got = transforms(lambda *d: folded(*merge(const_args, d)), dyn, dyn_b, use_grad)
        return want, got

    # One compilation per program: pe's residual is traced into the same jit
    # as the reference (compiling each separately would dominate the run).
    compiled = jax.jit(both, static_argnums=3, compiler_options=FAST_COMPILE)
    use_grad = not any(op[0] == "while" for op in program["ops"])
    try:
        want, got = compiled(const_args, dyn_args, dyn_batched, use_grad)
    except ValueError:  # reverse mode through a while_loop: compare forward mode
        use_grad = False
        want, got = compiled(const_args, dyn_args, dyn_batched, use_grad)
    for what, g, w in zip(["value", "grad" if use_grad else "jvp", "vmap"], got, want):
        _close(g, w, f"{what} of {program}")


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # some programs fold nothing
@given(programs())
def test_random_programs(program):
    check(program)


@settings(max_examples=10, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # some programs fold nothing
@given(programs())
def test_pejit_matches_pe(program):
    f = functools.partial(run, program)
    known = tuple(i for i, k in enumerate(program["known"]) if k)
    args = _inputs(program)
    want = jax.jit(f)(*args)
    _close(pejit(lambda *a: f(*a), constant_argnums=known)(*args), want, f"pejit of {program}")
    _close(pe(lambda *a: f(*a), constant_argnums=known)(*args), want, f"pe of {program}")


def test_fully_known_scan_folds():
    """Regression (JAX 0.7): folding a known ``scan`` failed with "Evaluation
    rule for 'empty' not implemented", because the folding trace's
    ``eager_constant_folding`` leaked into the scan's compilation."""

    def f(a, y):
        def body(c, x):
            return jnp.tanh(c * x + jnp.abs(a)), jnp.sum(c)

        c, ys = lax.scan(body, a + a, jnp.stack([a, a, a]))
        return c + ys.mean() + y

    a, y = jnp.full(N, 0.1), jnp.ones(N)
    _close(pe(f, constant_argnums=0)(a, y), jax.jit(f)(a, y), "known scan")
