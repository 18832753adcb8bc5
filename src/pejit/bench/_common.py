"""Shared by the benchmark processes: the flag, timing, and subprocesses.

Every process of the suite (the driver, its workers, the TFC worker) turns
off XLA:CPU's YNN fusion before JAX starts: jaxlib 0.10.2 miscompiles some
reductions with it (JAX issue #39103).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="


def set_xla_flags() -> None:
    """Add the YNN workaround to ``XLA_FLAGS``; call before importing jax.

    ``PEJIT_BENCH_KEEP_XLA_FLAGS=1`` leaves the flags alone (for an XLA that
    does not know the flag).
    """
    if os.environ.get("PEJIT_BENCH_KEEP_XLA_FLAGS") == "1":
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if YNN_OFF not in flags:
        os.environ["XLA_FLAGS"] = (flags + " " + YNN_OFF).strip()


def per_call(fn: Callable[[], Any], *, min_seconds: float = 0.02, repeat: int = 5) -> list[float]:
    """Seconds per call of ``fn`` (which returns arrays), one sample per repeat.

    Each sample times enough back-to-back calls to last ``min_seconds``,
    waiting for the results of the last one (calls are queued
    asynchronously, as in real use).
    """
    import jax

    jax.block_until_ready(fn())
    start = time.perf_counter()
    jax.block_until_ready(fn())
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(min_seconds / once))
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            out = fn()
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) / number)
    return samples


def rounds(fns: dict[str, Callable[[], Any]], *, min_seconds: float, repeat: int) -> dict[str, list[float]]:
    """Seconds per call of each function, one sample per round, sampled round-robin.

    The order rotates from round to round, so that no function always runs
    right after the same neighbour (a heavy one leaves threads and caches
    busy for a while).
    """
    samples: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeat):
        for name in names[r % len(names):] + names[: r % len(names)]:
            samples[name] += per_call(fns[name], min_seconds=min_seconds, repeat=1)
    return samples


def interleaved(fns: dict[str, Callable[[], Any]], *, min_seconds: float, repeat: int) -> dict[str, float]:
    """Median seconds per call of each function, from :func:`rounds`."""
    return {k: statistics.median(v) for k, v in rounds(fns, min_seconds=min_seconds, repeat=repeat).items()}


def paired_ratios(samples: dict[str, list[float]], ref: str) -> dict[str, float]:
    """Median over rounds of each function's time over ``ref``'s in the same round.

    On a shared machine the speed changes from second to second; samples
    taken in the same round saw about the same machine, so their ratio is
    far steadier than a ratio of medians taken over the whole run.
    """
    return {
        k: statistics.median(a / b for a, b in zip(v, samples[ref]))
        for k, v in samples.items()
    }


def src_root() -> str:
    """The directory holding the ``pejit`` package (for workers' PYTHONPATH)."""
    import pejit

    return str(Path(pejit.__file__).resolve().parent.parent)


def run_worker(python: str, module: str, spec: dict, timeout: float = 600, env: dict | None = None) -> dict:
    """Run ``python -m module '<spec json>'``; return the JSON it prints last.

    The worker inherits this process's ``XLA_FLAGS`` (the driver sets them
    before JAX starts); workers must not set them on import, since pytest's
    doctest collection imports them into the test process.
    """
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join([src_root(), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [python, "-m", module, json.dumps(spec)], env=env, capture_output=True, text=True, timeout=timeout
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise RuntimeError(f"{module} {spec.get('case')} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1])


def worker_main(handlers: dict[str, Callable[[dict], dict]]) -> None:
    """Entry point of a worker process: run the case named in argv[1]."""
    spec = json.loads(sys.argv[1])
    out = handlers[spec["case"]](spec)
    print(json.dumps(out), flush=True)


def _s(t) -> str:
    if t is None:
        return "n/a"
    return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"


def mib(b: float | None) -> str:
    return "n/a" if b is None else f"{b / 2**20:.0f} MiB"


def _sample(fn: Callable[[], Any], calls: int) -> float:
    """Seconds per call of ``calls`` calls of ``fn``, its last result waited for."""
    import jax

    start = time.perf_counter()
    for _ in range(calls):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / calls


def paired(fns: dict[str, Callable[[], Any]], ref: str, calls: int, pairs: int, also: tuple[str, ...] = ()) -> dict:
    """Per-call medians, and each function's median difference from and ratio to
    ``ref`` over rounds in which both ran back to back (the order alternating);
    ratios to each of ``also`` too, under ``ratio_to``."""
    for fn in fns.values():
        _sample(fn, calls)  # warm: compiled, memoized
    samples: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(pairs):
        for name in names if r % 2 else names[::-1]:
            samples[name].append(_sample(fns[name], calls))
    ratios = paired_ratios(samples, ref)
    return {
        "times": {k: statistics.median(v) for k, v in samples.items()},
        "extra": {k: statistics.median(a - b for a, b in zip(v, samples[ref])) for k, v in samples.items() if k != ref},
        "ratio": {k: r for k, r in ratios.items() if k != ref},
        **({"ratio_to": {other: paired_ratios(samples, other) for other in also}} if also else {}),
    }
