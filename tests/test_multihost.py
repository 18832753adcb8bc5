"""Multi-process JAX (``jax.distributed``): 2 and 4 processes on this machine.

Each job runs ``_multihost_worker.py`` in every process (2 CPU devices per
process, gloo collectives, constants sharded over all devices) and the
checks run here: values against NumPy in float64 and against this
process's single-process run, placement of inputs and folded constants,
the all-gathers of the compiled residual, agreement between processes,
``jax.grad``, and the error for what cannot work across processes.
Jobs are bounded in time (``launch`` kills them) and stop by themselves.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pejit import pejit
from pejit.bench._multihost import chain, launch, matrix

from . import _multihost_worker as w

WORKER = Path(__file__).with_name("_multihost_worker.py")
CASES = ("chain", "lapack", "inv", "inv_sharded", "scan", "python_if")
PROCESSES = [2, pytest.param(4, id="4-processes")]


@pytest.fixture(scope="module", params=PROCESSES)
def job(request) -> tuple[int, list[dict]]:
    n = request.param
    return n, launch([str(WORKER)], n, timeout=240)


# -- the references, in float64 -------------------------------------------------
def _oracles() -> dict[str, np.ndarray]:
    A = matrix(n=w.N).astype(np.float64)
    B = w.spd_batch().astype(np.float64)
    x, y = w.x_vector().astype(np.float64), w.y_batch().astype(np.float64)
    C = np.cos(np.sin(A) * 2 + 1)
    c = x
    for _ in range(3):
        c = np.tanh((np.cos(A) * 0.1) @ c)
    k = int((A > 0).sum())
    assert A.sum() > 0  # the branch the worker takes
    return {
        "chain": C @ x,
        "lapack": np.linalg.inv(B) @ y + np.linalg.cholesky(B) @ y,
        "inv": np.linalg.inv(A + w.N * np.eye(w.N)) @ x,
        "inv_sharded": np.linalg.inv(A + w.N * np.eye(w.N)) @ x,
        "scan": c,
        "python_if": np.exp(A * 0.01) @ x + k,
        "grad_chain": C.T @ np.ones(w.N),
        "tfc_chain": C @ x,
    }


def _single_process() -> dict[str, np.ndarray]:
    """The same programs through pejit in this (single-device) process."""
    A, B = jnp.asarray(matrix(n=w.N)), jnp.asarray(w.spd_batch())
    x, y = jnp.asarray(w.x_vector()), jnp.asarray(w.y_batch())
    f = pejit(chain, constant_argnums=0)
    return {
        "chain": f(A, x),
        "lapack": pejit(w.lapack, constant_argnums=0)(B, y),
        "inv": pejit(w.inv_matvec, constant_argnums=0)(A, x),
        "inv_sharded": pejit(w.inv_matvec, constant_argnums=0)(A, x),
        "scan": pejit(w.scan_invariant, constant_argnums=0)(A, x),
        "python_if": pejit(w.python_if, constant_argnums=0)(A, x),
        "grad_chain": jax.grad(lambda x: f(A, x).sum())(x),
        "tfc_chain": pejit(A, x, constant_arg_nums=[0])(chain)(x),
    }


def test_values_match_numpy_and_the_single_process_run(job):
    n, results = job
    oracle, single = _oracles(), _single_process()
    for r in results:
        assert (r["process_count"], r["device_count"]) == (n, 2 * n)
        for name in (*CASES, "grad_chain", "tfc_chain"):
            got = np.asarray(r[name]["value"] if name in CASES else r[name])
            np.testing.assert_allclose(got, oracle[name], rtol=2e-4, atol=2e-4, err_msg=name)
            np.testing.assert_allclose(got, np.asarray(single[name]), rtol=1e-5, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(r["vmap_chain"], [oracle["chain"], 2 * oracle["chain"]], rtol=2e-4, atol=2e-4)
        assert r["explain_chain"].startswith("residual 1 equation (dot_general"), r["explain_chain"]


def test_no_process_holds_a_whole_constant(job):
    n, results = job
    for r in results:
        assert r["input_fraction"] == {"a": 1 / n, "b": 1 / n}
        # folded constants stay sharded like the constant they come from,
        # LAPACK included when it works on a batch sharded over the batch
        for name in ("chain", "lapack", "scan", "python_if", "inv_sharded"):
            assert [c["fraction"] for c in r[name]["consts"]] == [1 / n] * len(r[name]["consts"]), name
            assert all(c["spec"] == ["d"] for c in r[name]["consts"]), name
        # LAPACK on one matrix cannot be distributed: XLA gathers it and the
        # result is replicated, unless constant_shardings places it
        assert [c["fraction"] for c in r["inv"]["consts"]] == [1.0]


def test_residual_has_no_all_gather_of_a_constant(job):
    _, results = job
    matrix_type = f"f32[{w.N},{w.N}]"
    for r in results:
        for name in CASES:
            assert matrix_type not in r[name]["all_gathers"], (name, r[name]["all_gathers"])
        # the scan's carry is gathered once per step (the product of a
        # row-sharded matrix), a vector: the matrix never is
        assert set(r["scan"]["all_gathers"]) <= {f"f32[{w.N}]"}


def test_every_process_builds_the_same_specialization(job):
    _, results = job
    first = results[0]
    for r in results[1:]:
        for name in CASES:
            assert r[name]["residual"] == first[name]["residual"], name
            assert r[name]["keys"] == first[name]["keys"], name
    for name in CASES:
        assert first[name]["misses"] == 1, name
    # the loop-invariant cos(a) was hoisted out of the scan and folded
    assert "cos" not in first["scan"]["residual"] and "scan" in first["scan"]["residual"]
    # Python's `if` and int() on the constant were decided at fold time
    assert "exp" not in first["python_if"]["residual"]


def test_a_sharded_value_needed_in_python_names_the_line(job):
    n, results = job
    for r in results:
        err = r["boolean_mask"]
        assert err is not None and err["type"] == "ValueError"
        assert "_multihost_worker.py" in err["message"] and "a[a > 0]" in err["message"]
        assert f"sharded across the {n} processes" in err["message"]


def test_inside_jax_jit_the_folded_constants_are_closed_over_where_jax_allows(job):
    # Before JAX 0.12.1 an outer jax.jit may not close over arrays spanning other
    # processes' devices (docs/multihost.md); from 0.12.1 it may, and computes the call's value
    _, results = job
    for r in results:
        got = r["inside_jit"]
        if tuple(int(p) for p in jax.__version__.split(".")[:3]) < (0, 12, 1):
            assert got.get("type") == "RuntimeError" and "non-addressable" in got["message"]
        else:
            assert got == {"value": r["chain"]["value"]}


def test_per_process_peak_memory_while_folding():
    """A 64 MiB constant over 2 processes: each holds and allocates half or less.

    The peak is that of folding a second value with the compiled folding
    program (the first one's compiler memory would swamp it at this size).
    """
    size = 4096
    results = launch(["-m", "pejit.bench._multihost", str(size)], 2, timeout=240)
    for r in results:
        assert r["constant_bytes"] == size * size * 4
        assert r["held_bytes"] == r["constant_bytes"] // 2
        assert r["folded_held_bytes"] == [r["constant_bytes"] // 2]
        assert r["refold_peak_bytes"] < r["constant_bytes"], r
