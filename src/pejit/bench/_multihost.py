"""Run a program as N JAX processes on this machine (``jax.distributed``, CPU).

Used by the suite's multi-process case and by ``tests/test_multihost.py``.
:func:`launch` starts ``n`` fresh Pythons, each with ``devices_per_process``
CPU devices, a coordinator on a free localhost port, and a results
directory; each worker calls :func:`initialize` before anything else
touches JAX, hands back one JSON object with :func:`write_result`, and
exits. A job that hangs (a collective waiting for a peer that died) is
killed, with every process group, at ``timeout``.

``python -m pejit.bench._multihost N`` is such a worker: it folds an N x N
elementwise chain sharded over every process's devices and reports the
fold time and the peak memory of its process (:func:`fold_memory`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def free_port() -> int:
    """A localhost port nobody listens on (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _xla_flags(devices: int) -> str:
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
    return " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])


def launch(argv: Sequence[str], n: int, *, devices_per_process: int = 2, timeout: float = 180) -> list[dict]:
    """Run ``python *argv`` as ``n`` processes of one JAX job; their results in process order.

    Raises ``RuntimeError`` with the tail of every process's output when
    one fails or the job outlives ``timeout`` seconds.
    """
    from ._common import src_root

    with tempfile.TemporaryDirectory(prefix="pejit-multihost-") as out:
        env = dict(os.environ)
        env.update(
            XLA_FLAGS=_xla_flags(devices_per_process),
            JAX_PLATFORMS="cpu",
            PYTHONPATH=os.pathsep.join([src_root(), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            PEJIT_MULTIHOST_COORDINATOR=f"127.0.0.1:{free_port()}",
            PEJIT_MULTIHOST_PROCESSES=str(n),
            PEJIT_MULTIHOST_OUT=out,
        )
        logs = [open(Path(out) / f"{i}.log", "w+") for i in range(n)]
        procs = [
            subprocess.Popen(
                [sys.executable, *argv], stdout=logs[i], stderr=subprocess.STDOUT,
                env={**env, "PEJIT_MULTIHOST_PROCESS_ID": str(i)}, start_new_session=True,
            )
            for i in range(n)
        ]
        deadline = time.monotonic() + timeout
        try:
            codes = [p.wait(timeout=max(deadline - time.monotonic(), 0.1)) for p in procs]
        except subprocess.TimeoutExpired:
            codes = None
        finally:
            for p in procs:  # each worker leads its own process group
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        tails = []
        for i, log in enumerate(logs):
            log.seek(0)
            tails.append(f"--- process {i} ---\n{log.read()[-4000:]}")
            log.close()
        if codes is None or any(codes):
            why = f"timed out after {timeout} s" if codes is None else f"exit codes {codes}"
            raise RuntimeError(f"{' '.join(argv)} as {n} processes: {why}\n" + "\n".join(tails))
        return [json.loads((Path(out) / f"{i}.json").read_text()) for i in range(n)]


def initialize() -> int:
    """In a worker: join the job started by :func:`launch`; returns the process id.

    Turns off the YNN fusion where this jaxlib has it and chooses gloo for
    CPU collectives: a worker's choices, made before JAX starts. pejit
    itself never changes JAX's configuration.
    """
    from .._xla_flags import turn_off_ynn_fusion

    turn_off_ynn_fusion()  # before JAX's backend starts (see conftest.py)
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    pid = int(os.environ["PEJIT_MULTIHOST_PROCESS_ID"])
    jax.distributed.initialize(
        os.environ["PEJIT_MULTIHOST_COORDINATOR"], int(os.environ["PEJIT_MULTIHOST_PROCESSES"]), pid,
        initialization_timeout=120,
    )
    return pid


def write_result(pid: int, result: dict) -> None:
    """In a worker: hand ``result`` (JSON-able) back to :func:`launch`."""
    (Path(os.environ["PEJIT_MULTIHOST_OUT"]) / f"{pid}.json").write_text(json.dumps(result))


def matrix(rows: slice = slice(None), cols: slice = slice(None), n: int = 64, scale: float = 1.0) -> np.ndarray:
    """Rows ``rows`` of an n x n constant, computed from the indices alone.

    ``jax.make_array_from_callback`` asks each process for its own shards
    only, so no process ever builds the whole constant.
    """
    i = np.arange(n, dtype=np.float64)[rows][:, None]
    j = np.arange(n, dtype=np.float64)[cols][None, :]
    return (scale * (np.sin(0.37 * i + 0.11 * j) + np.cos(0.05 * i * j / n))).astype(np.float32)


def chain(a, x):
    """An elementwise chain on the constant, then a product with ``x``."""
    import jax.numpy as jnp

    return jnp.cos(jnp.sin(a) * 2.0 + 1.0) @ x


def fold_memory(n: int) -> dict:
    """Fold :func:`chain` on an n x n constant row-sharded over every device.

    The first value traces and compiles the folding program (``fold_s``,
    ``fold_peak_bytes``: how far this process's RSS rose above what it was
    before); a second value of the same structure is folded by that program
    (``refold_s``, ``refold_peak_bytes``). ``peak_rss_bytes``: the
    process's peak RSS over its life, JAX's runtime included.
    """
    import resource

    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from pejit import pejit

    from ._worker import _reset_peak_rss, _status_bytes

    mesh = Mesh(np.array(jax.devices()), ("d",))
    rows = NamedSharding(mesh, P("d"))
    a1, a2 = (
        jax.make_array_from_callback((n, n), rows, lambda idx, s=s: matrix(*idx, n=n, scale=s)) for s in (1.0, 0.5)
    )
    x = jax.device_put(np.ones(n, np.float32), NamedSharding(mesh, P()))
    f = pejit(chain, constant_argnums=0)
    jax.block_until_ready(jnp.zeros(3) + 1)  # runtime start-up is not folding
    out = {}
    for name, a in (("fold", a1), ("refold", a2)):
        before = _reset_peak_rss()
        start = time.perf_counter()
        spec = f.specialize(a, x)
        jax.block_until_ready(spec.consts)
        out[f"{name}_s"] = time.perf_counter() - start
        out[f"{name}_peak_bytes"] = _status_bytes("VmHWM") - before
    return {
        **out,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "constant_bytes": a2.nbytes,
        "held_bytes": sum(s.data.nbytes for s in a2.addressable_shards),
        "folded_held_bytes": [sum(s.data.nbytes for s in c.addressable_shards) for c in spec.consts],
    }


if __name__ == "__main__":
    write_result(initialize(), fold_memory(int(sys.argv[1])))
