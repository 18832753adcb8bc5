"""A script of many programs, each called once (issue 72): its time to the last result, pejit against ``jax.jit``.

``benchmarks/first_call.py`` gives each program a process of its own and
stops the clock at its first result. A user who swaps ``jax.jit`` for pejit
across a code base also runs programs one after the other in one process,
many of them once: whatever pejit does after a first result (a fold or a
compile for later calls, on a worker thread) shares the machine with the
programs that come next. Here one process runs the first ``--programs``
programs of the no-regret corpus (``benchmarks/no_regret.py``, ``--quick``'s
selection), each made and called once, and the clock stops at the last
result. Each variant runs in fresh processes, in rounds whose order
alternates; printed: each round's totals and the median ratio.

Run: ``python benchmarks/script_first_calls.py [--programs 20] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

_YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="  # JAX issue #39103
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_YNN_OFF}".strip()
sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = ("jax.jit", "pejit")


def worker(variant: str, programs: int) -> float:
    """Seconds from making the first function to the last result, in this fresh process."""
    import jax

    import no_regret
    from pejit import NothingFoldedWarning, pejit

    warnings.simplefilter("ignore", NothingFoldedWarning)
    chosen = list(no_regret.corpus(True))[:programs]
    jax.block_until_ready([a for _, _, args, _ in chosen for a in jax.tree.leaves(args) if isinstance(a, jax.Array)])
    start = time.perf_counter()
    for _, fun, args, nums in chosen:
        f = jax.jit(fun) if variant == "jax.jit" else pejit(fun, constant_argnums=nums)
        jax.block_until_ready(f(*args))
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*json.loads(args.worker))))
        return
    ratios = []
    for r in range(args.rounds):
        got = {}
        for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            cmd = [sys.executable, __file__, "--worker", json.dumps([variant, args.programs])]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            got[variant] = json.loads(out.splitlines()[-1])
        ratios.append(got["pejit"] / got["jax.jit"])
        print(f"round {r + 1}: jax.jit {got['jax.jit']:.3f} s, pejit {got['pejit']:.3f} s, "
              f"ratio {ratios[-1]:.2f}", flush=True)
    print(f"{args.programs} programs called once each: pejit / jax.jit median {statistics.median(ratios):.2f} "
          f"(range {min(ratios):.2f}-{max(ratios):.2f}, {args.rounds} rounds)")


if __name__ == "__main__":
    main()
