"""First call (issue 72): each program's first result under pejit against ``jax.jit``'s, in fresh processes.

What a user who swaps ``jax.jit`` for pejit waits for: from making the function to its
first result, in a process that has compiled nothing before. Every program runs in a
process of its own per variant, in rounds whose order alternates (the minimum over
rounds is each variant's figure): ``jax.jit`` with the constants as arguments (the
library's own jit where it has one: ``eqx.filter_jit``, ``nnx.jit``), and pejit with
them constant. Each worker also reports where its time went: JAX's own logs of
tracing, lowering and XLA compilation (``jax_log_compiles``, set in the worker only),
and pejit's stages (its ``look`` at jax.jit's trace, and the fold).

Programs: the no-regret set (``benchmarks/no_regret.py``: corpus, bench, case 14's
loops, the MJX rollout where installed), the libraries' cases of
``benchmarks/libraries.py``, and four programs from JAX libraries tried as a new
user would (a tinygp regression, a tinygp conditioned GP, an ott-jax Sinkhorn
solve, a jax-md rollout), each where its library is installed.

Run: ``python benchmarks/first_call.py [--quick] [--rounds 3] [--control] [--tfc] [--only SUBSTRING]
[--baseline SRC] [--out FILE]``
(``--quick``: every fifth corpus program; ``--tfc``: pejit in the TFC form,
``pejit(*args, constant_arg_nums=...)(f)(*dynamic args)``, made and called on the
clock). Prints a table (pejit over ``jax.jit`` per program, trace / fold /
compile of each) and the median and worst ratio.
``--control`` adds a third variant to every round, ``jax.jit`` again in a process
of its own: its ratio to the first is what this machine's noise alone gives a
row (the rows of 10-60 ms move by up to 50% from run to run), so the table's
median and worst ratio come with the same figures for two runs of one program.
``--baseline SRC`` adds pejit from another checkout's ``src`` (a ``git worktree`` of the
commit before a change) as a variant of every round, so that a change is measured
side by side with what it changes, alternating, not in another run.
``import pejit`` is paid once a process, before the clock starts, as ``import jax``
is; the table gives its time apart.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

_YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="  # JAX issue #39103
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_YNN_OFF}".strip()

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


# -- the programs: name -> builder() -> (fun, args, constant positions, jit of the library or None) --------------

def _new_user_programs():
    """Programs of JAX libraries nobody here wrote, written from their documentation."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)

    def tinygp_regression():
        import tinygp

        X = jnp.asarray(np.sort(rng.uniform(0, 10, 500)).astype(np.float32))
        y = jnp.asarray((np.sin(np.asarray(X)) + 0.1 * rng.standard_normal(500)).astype(np.float32))
        xq = jnp.asarray(np.linspace(0, 10, 200).astype(np.float32))

        def predict(data, xq):
            X, y = data
            gp = tinygp.GaussianProcess(tinygp.kernels.ExpSquared(scale=1.5), X, diag=0.1)
            return gp.predict(y, xq)

        return predict, ((X, y), xq), (0,), None

    def tinygp_conditioned():
        import tinygp

        X = jnp.asarray(np.sort(rng.uniform(0, 10, 500)).astype(np.float32))
        y = jnp.asarray((np.cos(np.asarray(X)) + 0.1 * rng.standard_normal(500)).astype(np.float32))
        Xq = jnp.asarray(np.linspace(0, 10, 100).astype(np.float32))

        def condition(X, y, Xq):
            gp = tinygp.GaussianProcess(tinygp.kernels.Matern32(scale=2.0), X, diag=0.05)
            cond = gp.condition(y, Xq).gp
            return cond.loc, cond.variance

        return condition, (X, y, Xq), (0, 2), None

    def ott_sinkhorn():
        from ott.geometry import pointcloud
        from ott.problems.linear import linear_problem
        from ott.solvers.linear import sinkhorn

        x = jnp.asarray(rng.standard_normal((300, 2)).astype(np.float32))
        z = jnp.asarray(rng.standard_normal((250, 2)).astype(np.float32) + 1.0)
        a = jnp.ones(300) / 300
        b = jnp.ones(250) / 250

        def transport(points, a, b):
            x, z = points
            geom = pointcloud.PointCloud(x, z, epsilon=0.05)
            out = sinkhorn.Sinkhorn()(linear_problem.LinearProblem(geom, a, b))
            return out.reg_ot_cost

        return transport, ((x, z), a, b), (0,), None

    def jax_md_rollout():
        from jax_md import energy, simulate, space

        n, box = 128, 12.0
        displacement, shift = space.periodic(box)
        R = jnp.asarray(rng.uniform(0, box, (n, 2)).astype(np.float32))
        sigma = jnp.asarray(np.full(n, 1.0, np.float32))

        def rollout(sigma, R):
            energy_fn = energy.soft_sphere_pair(displacement, sigma=sigma[0])
            init, apply = simulate.nve(energy_fn, shift, 1e-3)
            state = init(jax.random.key(0), R, kT=1e-2)
            return jax.lax.fori_loop(0, 100, lambda i, s: apply(s), state).position

        return rollout, (sigma, R), (0,), None

    return {"tinygp GP regression": tinygp_regression, "tinygp conditioned GP": tinygp_conditioned,
            "ott-jax Sinkhorn": ott_sinkhorn, "jax-md NVE rollout": jax_md_rollout}


def _no_regret_programs(quick: bool):
    """``(name, fun, args, constant positions)`` of each no-regret program, built as it is reached."""
    import no_regret as N

    for source in (N.corpus(quick), N.bench_programs(), N.loops(), N.mjx_rollout()):
        yield from source


def sources(quick: bool) -> dict[str, list[str]]:
    """The programs' names by where they are built (run in the driver, which measures nothing)."""
    import libraries

    found = {"no_regret": [p[0] for p in _no_regret_programs(quick)], "new_user": list(_new_user_programs())}
    for build in libraries.PROGRAMS:
        try:
            found[f"libraries.{build.__name__}"] = list(build())
        except ImportError as e:
            print(f"  {build.__name__}: skipped ({e})", flush=True)
    return found


def build(source: str, name: str, quick: bool) -> tuple:
    """``(fun, args, constant positions, the library's jit or None)`` of one program."""
    if source == "no_regret":  # the programs before it are built too, but none is run
        _, fun, args, nums = next(p for p in _no_regret_programs(quick) if p[0] == name)
        return fun, args, nums, None
    if source == "new_user":
        return _new_user_programs()[name]()
    import libraries

    return tuple(getattr(libraries, source.removeprefix("libraries."))()[name])


# -- one worker: one variant's first call in this fresh process ---------------------------------------------------

# JAX's messages: "Finished tracing f for jit in ...", "Finished jaxpr to MLIR module conversion jit(f) in ...",
# "Finished XLA compilation of jit(f) in ..." (older JAX: "Finished tracing + transforming f ...")
_JAX_LOG = re.compile(r"Finished (tracing|jaxpr to MLIR module conversion|XLA compilation)\b.* in ([0-9.e+-]+) (?:sec|s)")
_PEJIT_LOG = re.compile(r"pejit .*?: (look|trace|fold|trace and fold|fold \(folding program\)) ([0-9.e+-]+) s$")


def worker(source: str, name: str, variant: str, quick: bool, tfc: bool = False) -> dict:
    import jax

    jax.config.update("jax_log_compiles", True)  # this benchmark process's own setting
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    for logger in ("jax", "pejit"):
        lg = logging.getLogger(logger)
        lg.addHandler(Keep())
        lg.setLevel(logging.DEBUG if logger == "jax" else logging.INFO)
        lg.propagate = False
    start = time.perf_counter()
    from pejit import pejit  # imported before the clock starts, as jax is: once a process, not per program

    imported = time.perf_counter() - start
    fun, args, nums, library_jit = build(source, name, quick)
    jax.block_until_ready([a for a in jax.tree.leaves(args) if isinstance(a, jax.Array)])
    # Building may have traced the program: the corpus checks each case with
    # jax.eval_shape, whose trace jax.jit's first call would then reuse (0.3-2.5 ms
    # of a corpus row, that pejit's trace of its own wrapper pays). Neither variant
    # starts with anything traced, lowered or compiled.
    jax.clear_caches()
    records.clear()
    start = time.perf_counter()
    if variant in ("jax.jit", CONTROL):
        out = (library_jit or jax.jit)(fun)(*args)
    elif tfc:
        out = pejit(*args, constant_arg_nums=list(nums))(fun)(*(a for i, a in enumerate(args) if i not in nums))
    else:
        out = pejit(fun, constant_argnums=nums)(*args)
    jax.block_until_ready(out)
    total = time.perf_counter() - start
    parts = {"trace": 0.0, "lower": 0.0, "compile": 0.0, "look": 0.0, "fold": 0.0}
    for message in records:
        if (m := _JAX_LOG.search(message)) is not None:
            kind = {"tracing": "trace", "jaxpr to MLIR module conversion": "lower"}.get(m[1], "compile")
            parts[kind] += float(m[2])
        elif (m := _PEJIT_LOG.search(message)) is not None:
            parts["look" if m[1] == "look" else "fold"] += float(m[2])
    return {"total": total, **parts, "import": imported}


def _run_worker(source: str, name: str, variant: str, quick: bool, tfc: bool, baseline: str | None) -> dict | None:
    cmd = [sys.executable, __file__, "--worker", json.dumps([source, name, variant, quick, tfc])]
    env = None
    if variant == BASELINE:  # that checkout's pejit, imported ahead of this one
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [baseline, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        print(f"  {name} [{variant}]: failed: {tail[:160]}", flush=True)
        return None
    return json.loads(lines[-1])


VARIANTS = ("jax.jit", "pejit")
CONTROL = "jax.jit again"  # --control: the first variant again, for the noise alone
BASELINE = "pejit before"  # --baseline: pejit from another checkout


def _summary(label: str, rows: list[tuple[str, float]]) -> str:
    ratios = [r for _, r in rows]
    name, worst = max(rows, key=lambda row: row[1])
    return (f"{label}median {statistics.median(ratios):.2f}, worst {worst:.2f} ({name}), "
            f"over 1.1: {sum(r > 1.1 for r in ratios)} of {len(ratios)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--control", action="store_true", help="each round runs jax.jit twice (the noise alone)")
    parser.add_argument("--tfc", action="store_true", help="pejit in the TFC form")
    parser.add_argument("--only", default="", help="programs whose name contains this")
    parser.add_argument("--baseline", default=None, help="another checkout's src: its pejit as a variant too")
    parser.add_argument("--out", default=None, help="write the table here too (markdown)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*json.loads(args.worker))), flush=True)
        return 0
    names = [(source, name) for source, found in sources(args.quick).items() for name in found if args.only in name]
    variants = VARIANTS + ((CONTROL,) if args.control else ()) + ((BASELINE,) if args.baseline else ())
    rows = []
    for source, name in names:
        best: dict[str, dict] = {}
        for r in range(args.rounds):  # each variant first in turn
            for variant in variants[r % len(variants):] + variants[:r % len(variants)]:
                got = _run_worker(source, name, variant, args.quick, args.tfc, args.baseline)
                if got is not None and (variant not in best or got["total"] < best[variant]["total"]):
                    best[variant] = got
        if len(best) < len(variants):
            continue
        rows.append((name, best))
        j, p = best["jax.jit"], best["pejit"]
        again = f", jax.jit again {best[CONTROL]['total']:.3f} s" if args.control else ""
        again += f", pejit before {best[BASELINE]['total']:.3f} s" if args.baseline else ""
        print(f"{name}: jax.jit {j['total']:.3f} s, pejit {p['total']:.3f} s{again}, ratio "
              f"{p['total'] / j['total']:.2f} (pejit look {p['look']:.3f} fold {p['fold']:.3f} compile "
              f"{p['compile']:.3f}; jax.jit trace {j['trace']:.3f} compile {j['compile']:.3f})", flush=True)
    import jax

    control = " | jax.jit again / jax.jit" * args.control + " | pejit before / jax.jit" * bool(args.baseline)
    form = "pejit in the TFC form; " if args.tfc else ""
    lines = [f"jax {jax.__version__}, {jax.devices()[0].platform}; {len(rows)} programs; {form}first call (from making the "
             f"function to its first result), each variant in a fresh process, minimum of {args.rounds} alternating "
             "rounds; seconds", "",
             f"| program | jax.jit | trace | lower | compile | pejit | look | fold | compile | pejit / jax.jit{control} |",
             "|---|---|---|---|---|---|---|---|---|---|" + "---|" * control.count("|")]
    imports = [best["pejit"].get("import", 0.0) for _, best in rows]
    for name, best in rows:
        j, p = best["jax.jit"], best["pejit"]
        again = f" {best[CONTROL]['total'] / j['total']:.2f} |" if args.control else ""
        again += f" {best[BASELINE]['total'] / j['total']:.2f} |" if args.baseline else ""
        lines.append(f"| {name} | {j['total']:.3f} | {j['trace']:.3f} | {j['lower']:.3f} | {j['compile']:.3f} | "
                     f"{p['total']:.3f} | {p['look']:.3f} | {p['fold']:.3f} | {p['compile']:.3f} | "
                     f"{p['total'] / j['total']:.2f} |{again}")
    if rows:
        lines += ["", _summary("", [(name, best["pejit"]["total"] / best["jax.jit"]["total"]) for name, best in rows])]
        if args.control:
            lines += ["", _summary("control (jax.jit again / jax.jit): ",
                                   [(name, best[CONTROL]["total"] / best["jax.jit"]["total"]) for name, best in rows])]
        if args.baseline:
            lines += ["", _summary(f"pejit before ({args.baseline}) / jax.jit: ",
                                   [(name, best[BASELINE]["total"] / best["jax.jit"]["total"]) for name, best in rows])]
        lines += ["", f"`import pejit` (once a process, before the clock starts, as `import jax`): "
                      f"{min(imports):.3f}-{max(imports):.3f} s"]
    print("\n".join(lines[-5:]))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
