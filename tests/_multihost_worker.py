"""One process of the multi-process tests (run by ``pejit.bench._multihost.launch``).

``python tests/_multihost_worker.py``: joins the job, builds
constants sharded over every process's devices (each process creates only
its own rows: no process ever sees a whole constant), runs every case of
:func:`run_cases` through ``pejit`` and writes what the test checks: the
outputs gathered, the residual jaxpr, the cache keys, the placement of
inputs and folded constants, the all-gathers of the compiled residual
program, and the errors raised.

Imported by the test (without joining a job) for the programs and the data.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from pejit.bench._multihost import chain, initialize, matrix, write_result

N = 64  # rows and columns of the matrix constant
BATCH, M = 8, 6  # the batch of SPD matrices


def spd_batch(batch: slice = slice(None)) -> np.ndarray:
    """Matrices ``batch`` of a batch of SPD matrices, from the indices alone."""
    b = np.arange(BATCH, dtype=np.float64)[batch][:, None, None]
    i = np.arange(M, dtype=np.float64)[None, :, None]
    j = np.arange(M, dtype=np.float64)[None, None, :]
    g = np.sin(1.3 * b + 0.7 * i + 0.3 * j * (i + 1))
    return (g @ g.transpose(0, 2, 1) + M * np.eye(M)).astype(np.float32)


def x_vector() -> np.ndarray:
    return np.linspace(-1, 1, N, dtype=np.float32)


def y_batch() -> np.ndarray:
    return np.linspace(0, 1, BATCH * M, dtype=np.float32).reshape(BATCH, M, 1)


# -- the programs ---------------------------------------------------------------
def lapack(b, y):
    """LAPACK on a batch of constant matrices (sharded over the batch)."""
    return jnp.linalg.inv(b) @ y + jnp.linalg.cholesky(b) @ y


def inv_matvec(a, x):
    """LAPACK on one matrix: XLA has no distributed LAPACK, so it gathers."""
    return jnp.linalg.inv(a + N * jnp.eye(N, dtype=a.dtype)) @ x


def scan_invariant(a, x):
    """A scan whose body does loop-invariant work on the constant."""
    def body(c, _):
        return jnp.tanh((jnp.cos(a) * 0.1) @ c), None

    return jax.lax.scan(body, x, None, length=3)[0]


def python_if(a, x):
    """Python control flow and a Python int from the constant."""
    k = int((a > 0).sum())  # a replicated scalar: every process agrees
    if a.sum() > 0:
        return jnp.exp(a * 0.01) @ x + k
    return jnp.sin(a) @ x - k


def boolean_mask(a, x):
    """Needs the whole mask in Python: cannot work across processes."""
    return a[a > 0].sum() * x  # the line the error must name


# -- the worker --------------------------------------------------------------
def _fraction_held(arr) -> float:
    """Which fraction of ``arr``'s elements this process holds."""
    seen = {}
    for s in arr.addressable_shards:
        key = tuple((i.start, i.stop) for i in s.index)
        seen[key] = s.data.size
    return sum(seen.values()) / max(arr.size, 1)


def _all_gathers(compiled_text: str) -> list[str]:
    """Result types of the all-gathers in a compiled (partitioned) HLO module."""
    return re.findall(r"=\s*(\w+\[[\d,]*\])\S*\s+all-gather", compiled_text)


def run_cases() -> dict:
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from pejit import explain, pejit
    from pejit._jit import call_path

    mesh = Mesh(np.array(jax.devices()), ("d",))
    rows, replicated = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())
    a = jax.make_array_from_callback((N, N), rows, lambda idx: matrix(*idx, n=N))
    b = jax.make_array_from_callback((BATCH, M, M), rows, lambda idx: spd_batch(idx[0]))
    x = jax.device_put(x_vector(), replicated)
    y = jax.make_array_from_callback((BATCH, M, 1), rows, lambda idx: y_batch()[idx])

    cases = {
        "chain": (pejit(chain, constant_argnums=0), a, x),
        "lapack": (pejit(lapack, constant_argnums=0), b, y),
        "inv": (pejit(inv_matvec, constant_argnums=0), a, x),
        "inv_sharded": (pejit(inv_matvec, constant_argnums=0, constant_shardings=rows), a, x),
        "scan": (pejit(scan_invariant, constant_argnums=0), a, x),
        "python_if": (pejit(python_if, constant_argnums=0), a, x),
    }
    out: dict = {"process_count": jax.process_count(), "device_count": jax.device_count(),
                 "input_fraction": {"a": _fraction_held(a), "b": _fraction_held(b)}}
    for name, (f, const, dyn) in cases.items():
        value = f(const, dyn)
        spec = f.specialize(const, dyn)
        text = f.lower(const, dyn).compile().as_text()
        out[name] = {
            "value": np.asarray(multihost_utils.process_allgather(value, tiled=True)).tolist(),
            "residual": str(spec.program.jaxpr),
            "keys": repr(list(call_path(f).caches.programs.entries)),
            "consts": [
                {"shape": list(c.shape), "spec": list(getattr(c.sharding, "spec", [repr(c.sharding)])),
                 "fraction": _fraction_held(c)}
                for c in spec.consts
            ],
            "all_gathers": _all_gathers(text),
            "misses": f.cache_info().misses,
        }
    def gathered(value):
        return np.asarray(multihost_utils.process_allgather(value, tiled=True)).tolist()

    f = cases["chain"][0]
    out["grad_chain"] = gathered(jax.grad(lambda x: f(a, x).sum())(x))
    out["vmap_chain"] = gathered(jax.vmap(lambda x: f(a, x))(jnp.stack([x, 2 * x])))
    out["tfc_chain"] = gathered(pejit(a, x, constant_arg_nums=[0])(chain)(x))
    out["explain_chain"] = str(explain(chain, a, x, constant_argnums=0)).splitlines()[1]
    for name, call in (
        ("boolean_mask", lambda: pejit(boolean_mask, constant_argnums=0)(a, x)),
        # the folded constants would be closed over by the outer program
        ("inside_jit", lambda: jax.jit(lambda x: f(a, x))(x)),
    ):
        try:
            out[name] = {"value": gathered(call())}
        except Exception as e:  # the test checks type and message
            out[name] = {"type": type(e).__name__, "message": str(e)}
    return out


if __name__ == "__main__":
    pid = initialize()
    write_result(pid, run_cases())
