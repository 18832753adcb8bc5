"""Ridge regression with a design matrix sharded over two JAX processes.

Run directly (``python examples/multihost.py --rows 4096``), the script
starts two copies of itself on this machine, each a JAX process with two
CPU devices, joined by ``jax.distributed`` (on a cluster, start one per host
and pass ``--coordinator``, ``--num-processes`` and ``--process-id``). The
design matrix ``A`` is built row-sharded over all four devices: each
process creates only its own rows. pejit folds everything that depends on
``A`` once (the features ``tanh(A)``, the Gram matrix, its Cholesky
factor, a regularization chosen in Python from ``A``); each call then does
one product with the targets and two triangular solves. The launcher checks
the weights both processes found against NumPy in float64.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np

FEATURES = 32


def design_rows(rows: slice, n_rows: int) -> np.ndarray:
    """Rows ``rows`` of the design matrix, computed from the row indices alone."""
    i = np.arange(n_rows, dtype=np.float64)[rows][:, None]
    j = np.arange(FEATURES, dtype=np.float64)[None, :]
    return (np.sin(0.01 * i * (j + 1)) + 0.1 * np.cos(i + j)).astype(np.float32)


def targets(n_rows: int) -> np.ndarray:
    return np.cos(np.linspace(0, 6, n_rows)).astype(np.float32)


def fit(A, y):
    """Ridge weights for features ``tanh(A)``; ``A`` is constant, ``y`` is not."""
    import jax
    import jax.numpy as jnp

    phi = jnp.tanh(A)  # elementwise: stays row-sharded
    gram = phi.T @ phi  # a small matrix every process holds whole
    lam = 1e-3 * float(jnp.trace(gram)) / FEATURES  # Python reads a replicated scalar
    chol = jnp.linalg.cholesky(gram + lam * jnp.eye(FEATURES))
    z = jax.scipy.linalg.solve_triangular(chol, phi.T @ y, lower=True)
    return jax.scipy.linalg.solve_triangular(chol.T, z, lower=False)


def held(arr) -> float:
    """The fraction of a global array's elements this process holds."""
    shards = {tuple((i.start, i.stop) for i in s.index): s.data.size for s in arr.addressable_shards}
    return sum(shards.values()) / arr.size


def worker(args) -> None:
    import jax

    # CPU only: collectives between processes need an implementation (GPUs
    # and TPUs have theirs). This is the script's choice, made before JAX starts.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)

    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from pejit import explain, pejit

    n = args.rows
    mesh = Mesh(np.array(jax.devices()), ("rows",))
    by_rows = NamedSharding(mesh, P("rows"))
    A = jax.make_array_from_callback((n, FEATURES), by_rows, lambda idx: design_rows(idx[0], n))
    y = jax.make_array_from_callback((n,), by_rows, lambda idx: targets(n)[idx])

    fit_pe = pejit(fit, constant_argnums=0)
    w = fit_pe(A, y)
    spec = fit_pe.specialize(A, y)
    folded = ", ".join(f"{list(c.shape)} ({held(c):.0%} held)" for c in spec.consts)
    report = explain(fit_pe, A, y)  # folds: every process must take part
    lines = [f"process {jax.process_index()}: holds {held(A):.0%} of A; folded constants: {folded}"]
    if jax.process_index() == 0:
        lines.append(str(report))
    weights = np.asarray(multihost_utils.process_allgather(w, tiled=True)).tolist()
    print(json.dumps({"lines": lines, "weights": weights}), flush=True)
    jax.distributed.shutdown()


def launch(args) -> None:
    """Start the two processes here, wait for them, check what they found."""
    with socket.socket() as s:  # a free port for the coordinator
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
               + " --xla_force_host_platform_device_count=2 --xla_cpu_experimental_ynn_fusion_type=",
               JAX_PLATFORMS="cpu")
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rows", str(args.rows), "--coordinator", f"127.0.0.1:{port}",
             "--num-processes", "2", "--process-id", str(i)],
            env=env, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )
        for i in range(2)
    ]
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:  # a peer died: do not wait for it forever
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    if any(p.returncode for p in procs):
        sys.exit(f"a worker failed (exit codes {[p.returncode for p in procs]})")
    results = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    for r in results:
        print("\n".join(r["lines"]))
    A = design_rows(slice(None), args.rows).astype(np.float64)
    phi = np.tanh(A)
    gram = phi.T @ phi
    lam = 1e-3 * np.trace(gram) / FEATURES
    want = np.linalg.solve(gram + lam * np.eye(FEATURES), phi.T @ targets(args.rows))
    got = [np.asarray(r["weights"]) for r in results]
    assert np.array_equal(got[0], got[1]), "the processes disagree"
    error = np.max(np.abs(got[0] - want)) / np.max(np.abs(want))
    print(f"both processes agree; max relative error against NumPy (float64): {error:.1e}")
    assert error < 1e-3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--coordinator", help="host:port of process 0 (omit to launch both here)")
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--process-id", type=int, default=0)
    args = parser.parse_args(argv)
    if args.coordinator is None:
        launch(args)
    else:
        worker(args)


if __name__ == "__main__":
    main()
