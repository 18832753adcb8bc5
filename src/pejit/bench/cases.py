"""The cases of the suite (their pass/fail targets are in ``targets``).

Steady-state figures are medians of interleaved samples taken in this
process (the machines are noisy, so every ratio is measured side by side);
fold time, compile time and memory are measured in fresh processes (see
``_worker``); TFC always runs in a process of its own (see ``_tfc``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pejit import pejit

from . import gradients, loops, programs
from ._common import _s, interleaved, paired_ratios, rounds, run_worker


@dataclasses.dataclass
class Context:
    quick: bool
    tfc_python: str | None
    cold_repeat: int | None = None
    #: case 9's full-mode sizes to run (``PDE_FULL_SIZES``, ``wave2d_full``, ``wave2d_large``), None: all
    pde_sizes: tuple[str, ...] | None = None

    @property
    def min_seconds(self) -> float:
        return 0.02 if self.quick else 0.05

    @property
    def repeat(self) -> int:
        return 5 if self.quick else 9

    @property
    def rounds(self) -> int:
        """Rounds of the interleaved steady-state comparisons (short samples, many rounds)."""
        return 21 if self.quick else 61

    @property
    def paired_rounds(self) -> int:
        """Rounds of a comparison that must decide a few microseconds in a call
        of hundreds (case 8's auto against explicit): samples of about ten
        calls, so that the machine's drift cancels within each pair, and
        enough pairs that the median difference is known to about 2 us where
        single pairs spread by +-30 us."""
        return 601 if self.quick else 1001

    def tfc(self, module: str, spec: dict) -> dict | None:
        """Run a TFC measurement, or ``None`` without TFC (or when it fails)."""
        if self.tfc_python is None:
            return None
        try:
            return run_worker(self.tfc_python, module, spec)
        except Exception as e:  # report n/a, keep the suite going
            print(f"  TFC {spec['case']}: {e}".splitlines()[0], file=sys.stderr)
            return {"error": str(e)[-300:]}

    def tfc_env(self, module: str, spec: dict, env: dict[str, str]) -> dict:
        """A TFC-Python worker with extra environment variables (errors become ``{"error": ...}``)."""
        try:
            return run_worker(self.tfc_python, module, spec, env=env)
        except Exception as e:
            print(f"  {spec['case']}: {e}".splitlines()[0], file=sys.stderr)
            return {"error": str(e)[-300:]}

    def cold(self, spec: dict) -> dict:
        return run_worker(sys.executable, "pejit.bench._worker", spec)


def _max_error(fns: dict, ref: str) -> dict[str, float]:
    """Max abs difference from ``ref``'s result, relative to its largest entry."""
    want = np.asarray(fns[ref](), np.float64)
    scale = float(np.max(np.abs(want))) or 1.0
    return {k: float(np.max(np.abs(np.asarray(fn(), np.float64) - want))) / scale for k, fn in fns.items()}


def _steady(ctx: Context, fns: dict, heavy: tuple[str, ...], ref: str) -> tuple[dict[str, float], dict[str, float]]:
    """Interleaved medians, and ratios to ``ref`` paired by round.

    The slow variants are sampled in a block of their own, with fewer rounds.
    """
    light = rounds({k: f for k, f in fns.items() if k not in heavy}, min_seconds=ctx.min_seconds, repeat=ctx.rounds)
    times = {k: statistics.median(v) for k, v in light.items()}
    times.update(interleaved({k: fns[k] for k in heavy}, min_seconds=ctx.min_seconds, repeat=1 if ctx.quick else 3))
    return times, paired_ratios(light, ref)


def case1(ctx: Context) -> dict:
    """linsolve: inv(A) @ x + cholesky(A @ A.T) @ x, A constant (n = 1000, float32)."""
    n = 1000
    A, x = programs.linsolve_data(n)
    A, x = jnp.asarray(A), jnp.asarray(x)
    closed = jax.jit(lambda x: programs.linsolve(A, x))
    jit_args = jax.jit(programs.linsolve)
    pj = pejit(programs.linsolve, constant_argnums=0)
    hand = jax.jit(programs.linsolve_folded)
    # Which buffers the two matrix-vector products read changes their time
    # noticeably from process to process (the hand-folded program run on
    # pejit's folded buffers is exactly as fast, or as slow, as pejit). So
    # both are measured on four constant sets, each pair of samples on the
    # same set in the same round, and no variant is stuck with one lucky or
    # unlucky placement.
    As = [A] + [jnp.asarray(programs.linsolve_data(n, seed)[0]) for seed in (1, 2, 3)]
    folded = [jax.block_until_ready((jnp.linalg.inv(a), jnp.linalg.cholesky(a @ a.T))) for a in As]
    fns = {
        "jit_args": lambda: jit_args(A, x),
        "jit_closed": lambda: closed(x),
        "pejit": lambda: pj(A, x),
        "hand": lambda: hand(*folded[0], x),
    }
    errors = _max_error(fns, "hand")
    per_set = {}
    for k, (a, f) in enumerate(zip(As, folded)):
        per_set[f"pejit{k}"] = functools.partial(pj, a, x)
        per_set[f"hand{k}"] = functools.partial(hand, *f, x)
    samples = rounds(per_set, min_seconds=ctx.min_seconds, repeat=ctx.rounds)
    pooled = {v: [t for k in range(len(As)) for t in samples[f"{v}{k}"]] for v in ("pejit", "hand")}
    times = {v: statistics.median(ts) for v, ts in pooled.items()}
    times.update(interleaved({k: fns[k] for k in ("jit_args", "jit_closed")}, min_seconds=ctx.min_seconds,
                             repeat=1 if ctx.quick else 3))
    ratios = {"pejit": statistics.median(
        a / b for k in range(len(As)) for a, b in zip(samples[f"pejit{k}"], samples[f"hand{k}"])
    )}
    tfc = ctx.tfc("pejit.bench._tfc", {"case": "linsolve", "n": n, "min_seconds": ctx.min_seconds, "repeat": ctx.repeat})
    times["tfc"] = (tfc or {}).get("tfc")
    return {"times": times, "ratios": ratios, "max_abs_error": errors, "tfc_error": (tfc or {}).get("error")}


def case2(ctx: Context) -> dict:
    """basis: TFC-style least-squares residual on a Chebyshev basis of constant points."""
    points, degree = 4096, 64
    x, xi = programs.basis_data(points, degree)
    x, xi = jnp.asarray(x), jnp.asarray(xi)

    def residual(x, xi):
        return programs.basis_residual(x, xi, degree)

    jit_args = jax.jit(residual)
    closed = jax.jit(lambda xi: residual(x, xi))
    pj = pejit(residual, constant_argnums=0)
    K, rhs = programs.basis_fold_by_hand(x, degree)
    hand = jax.jit(programs.basis_residual_folded)
    fns = {
        "jit_args": lambda: jit_args(x, xi),
        "jit_closed": lambda: closed(xi),
        "pejit": lambda: pj(x, xi),
        "hand": lambda: hand(K, rhs, xi),
    }
    errors = _max_error(fns, "hand")
    times, ratios = _steady(ctx, fns, heavy=("jit_args",), ref="hand")
    spec = {"points": points, "degree": degree, "min_seconds": ctx.min_seconds, "repeat": ctx.repeat}
    tfc = ctx.tfc("pejit.bench._tfc", {"case": "basis", **spec})
    times["tfc"] = (tfc or {}).get("tfc")
    utfc = ctx.tfc("pejit.bench._tfc", {"case": "basis_utfc", **spec})
    return {"times": times, "ratios": ratios, "max_abs_error": errors, "utfc": utfc, "points": points, "degree": degree}


def case3(ctx: Context) -> dict:
    """PLN (seed 003): Poisson log-normal fit, n = 11600, p = 114, d = 1, Adam."""
    iterations = 20 if ctx.quick else 1000
    Y, O, X = programs.pln_data()
    Y, O, X = jnp.asarray(Y), jnp.asarray(O), jnp.asarray(X)
    state0 = programs.pln_init(Y, X)
    stirling = jax.block_until_ready(jnp.sum(programs.log_stirling(Y)))

    jit_step = jax.jit(programs.pln_step)
    pejit_step = pejit(programs.pln_step, constant_argnums=(1, 2, 3))
    hand_step = jax.jit(programs.pln_step_folded)
    steps = {
        "jit_step": lambda s: jit_step(s, Y, O, X),
        "pejit_step": lambda s: pejit_step(s, Y, O, X),
        "hand_step": lambda s: hand_step(s, Y, O, X, stirling),
    }
    jit_scan = jax.jit(programs.pln_fit, static_argnums=4)
    pejit_scan = pejit(programs.pln_fit, constant_argnums=(1, 2, 3), static_argnums=4)
    hand_scan = jax.jit(programs.pln_fit_folded, static_argnums=5)
    scans = {
        "jit_scan": lambda: jit_scan(state0, Y, O, X, iterations),
        "pejit_scan": lambda: pejit_scan(state0, Y, O, X, iterations),
        "hand_scan": lambda: hand_scan(state0, Y, O, X, stirling, iterations),
    }
    # Per-step variants: run the fit step by step, all variants in lockstep,
    # timing each step (interleaved, so noise hits all of them alike).
    import time

    states = {k: state0 for k in steps}
    for k, step in steps.items():
        jax.block_until_ready(step(state0))  # compile
    elbo = {k: [] for k in steps}
    step_times = {k: [] for k in steps}
    for _ in range(iterations):
        for k, step in steps.items():
            start = time.perf_counter()
            states[k], loss = step(states[k])
            jax.block_until_ready(loss)
            step_times[k].append(time.perf_counter() - start)
            elbo[k].append(float(loss))
    times = {k: statistics.median(v) for k, v in step_times.items()}
    ratios = paired_ratios(step_times, "hand_step")
    for k, fn in scans.items():
        jax.block_until_ready(fn())  # compile
    scan_samples = {k: [] for k in scans}
    for _ in range(3):
        for k, fn in scans.items():
            start = time.perf_counter()
            out = jax.block_until_ready(fn())
            scan_samples[k].append((time.perf_counter() - start) / iterations)
            elbo[k] = [float(v) for v in np.asarray(out)]
    times.update({k: statistics.median(v) for k, v in scan_samples.items()})
    ratios.update(paired_ratios(scan_samples, "hand_scan"))
    ref = np.asarray(elbo["jit_step"], np.float64)
    agreement = {k: _max_rel_diff(np.asarray(v, np.float64), ref) for k, v in elbo.items()}
    spec = {"n": Y.shape[0], "p": Y.shape[1], "min_seconds": ctx.min_seconds, "repeat": 3}
    tfc = ctx.tfc("pejit.bench._tfc", {"case": "pln", **spec})
    times["tfc_step"] = (tfc or {}).get("tfc")
    return {
        "times": times, "ratios": ratios, "iterations": iterations, "elbo_max_rel_diff": agreement,
        "elbo": {k: v for k, v in elbo.items() if k in ("jit_step", "pejit_step", "pejit_scan")},
        "tfc_error": (tfc or {}).get("error"),
    }


def _max_rel_diff(values: np.ndarray, ref: np.ndarray) -> float:
    """Largest relative difference; a non-finite value counts as equal only to itself."""
    same = (values == ref) | (np.isnan(values) & np.isnan(ref))
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(same, 0.0, np.abs(values - ref) / np.abs(ref))
    return float(np.max(np.nan_to_num(rel, nan=np.inf)))


FOLD_GRID = ((256, 1000), (2048, 50), (2048, 200))


def case4(ctx: Context) -> dict:
    """fold time: chains of K elementwise ops on an N x N constant, to the first
    result: the light chain (``+ x``), then the ``sin`` chain a user wrote (``@ x``)."""
    light = ["pejit", "one_program", "tfc"] + ([] if ctx.quick else ["pejit_eager", "pejit_compiled"])
    repeat = ctx.cold_repeat or (1 if ctx.quick else 3)
    out: dict[str, Any] = {}
    for program, variants in (("chain", light), ("sin_chain", ["pejit", "one_program", "tfc"])):
        for N, K in FOLD_GRID:
            samples: dict[str, list[float]] = {v: [] for v in variants}
            for _ in range(repeat):
                for v in variants:
                    spec = {"case": "fold_time", "program": program, "N": N, "K": K, "variant": v}
                    if v == "tfc":
                        r = ctx.tfc("pejit.bench._worker", spec)
                        if r and "seconds" in r:
                            samples[v].append(r["seconds"])
                    else:
                        samples[v].append(ctx.cold(spec)["seconds"])
            point = f"{N}x{K}" if program == "chain" else f"{program} {N}x{K}"
            out[point] = {v: (statistics.median(s) if s else None) for v, s in samples.items()}
            print(f"  {point}: " + ", ".join(f"{v} {_s(t)}" for v, t in out[point].items()), flush=True)
    return {"fold_seconds": out, "repeat": repeat}


def case5(ctx: Context) -> dict:
    """compile time and peak memory vs folded constant size: cos(A) @ x, A n x n."""
    out = {}
    for n in (256, 2048, 8192):
        row = {"pejit": ctx.cold({"case": "compile_memory", "n": n, "variant": "pejit"})}
        if not ctx.quick or n < 8192:
            row["tfc"] = ctx.tfc("pejit.bench._worker", {"case": "compile_memory", "n": n, "variant": "tfc"})
        out[n] = row
        print(f"  n={n}: pejit compile {_s(row['pejit']['compile_s'])}, "
              f"peak +{row['pejit']['peak_increase_bytes'] / 2**20:.0f} MiB", flush=True)
    return {"sizes": out}


def case6(ctx: Context) -> dict:
    """dispatch: per-call overhead of the call-time form on tiny inputs."""
    c, x = jnp.ones(3), jnp.arange(3.0)
    jitted = jax.jit(programs.tiny)
    pj = pejit(programs.tiny, constant_argnums=0)
    bound = pejit(c, x, constant_arg_nums=[0])(programs.tiny)
    fns = {"jax.jit": lambda: jitted(c, x), "pejit": lambda: pj(c, x), "pejit_tfc_form": lambda: bound(x)}
    samples = rounds(fns, min_seconds=ctx.min_seconds, repeat=ctx.rounds)
    times = {k: statistics.median(v) for k, v in samples.items()}
    return {"times": times, "ratios": paired_ratios(samples, "jax.jit")}


def case7(ctx: Context) -> dict:
    """multi-host: fold time and per-process peak memory, 1/2/4 processes, one sharded constant."""
    from . import _multihost

    n = 2048 if ctx.quick else 8192
    out = {}
    for processes in (1, 2, 4):
        rows = _multihost.launch(["-m", "pejit.bench._multihost", str(n)], processes, timeout=600)
        out[processes] = {key: max(r[key] for r in rows) for key in rows[0] if key != "folded_held_bytes"}
        row = out[processes]
        print(f"  {processes} process(es): fold {_s(row['fold_s'])} (peak +{row['fold_peak_bytes'] / 2**20:.0f} MiB), "
              f"refold {_s(row['refold_s'])} (peak +{row['refold_peak_bytes'] / 2**20:.0f} MiB), "
              f"peak RSS {row['peak_rss_bytes'] / 2**20:.0f} MiB", flush=True)
    return {"n": n, "processes": out}
def _loop_seconds(make, calls: list[tuple]) -> float:
    """Seconds for a fresh function from ``make()`` to run ``calls``, compiles included.

    JAX's caches are cleared first, so every loop starts cold, as a new
    process would (the generic program of ``constant_argnums="auto"`` would
    otherwise find ``jax.jit``'s compiled program of an earlier round).
    """
    jax.clear_caches()
    fn = make()
    start = time.perf_counter()
    for args in calls:
        out = fn(*args)
    jax.block_until_ready(out)
    return time.perf_counter() - start


#: Case 8's cold-process comparison: this many calls from creating the function.
FIRST_CALLS = 60
#: Warm calls before case 8's steady-state samples (auto has promoted by then).
WARM_CALLS = 10


def case8(ctx: Context) -> dict:
    """auto: ``loss(params, X, y)``, X 2000x500 fixed, cholesky(X.T @ X + l I) inside."""
    X, y = programs.ridge_data()
    X, y = jnp.asarray(X), jnp.asarray(y)
    X2 = X + 0  # the same values, another object
    rng = np.random.default_rng(1)
    params = [jnp.asarray(rng.standard_normal(X.shape[1]).astype(np.float32)) for _ in range(WARM_CALLS + 10)]
    loss = programs.ridge_loss
    makers = {
        "auto": lambda: pejit(loss, constant_argnums="auto"),
        "explicit": lambda: pejit(loss, constant_argnums=(1, 2)),
        "jax.jit": lambda: jax.jit(loss),
    }
    def promoted(make):  # the third call: auto has folded by then
        fn = make()
        return [fn(p, X, y) for p in params[:3]][-1]

    errors = _max_error({k: functools.partial(promoted, m) for k, m in makers.items()}, "jax.jit")
    # The first calls of a cold process, each variant in a fresh one, the
    # order rotating from round to round.
    first: dict[str, list] = {k: [] for k in makers}
    names = list(makers)
    for r in range(ctx.cold_repeat or (3 if ctx.quick else 5)):
        for k in names[r % len(names):] + names[: r % len(names)]:
            first[k].append(ctx.cold({"case": "first_calls", "variant": k, "calls": FIRST_CALLS}))
        print("  first calls: " + ", ".join(f"{k} {_s(v[-1]['seconds'])}" for k, v in first.items()), flush=True)
    # Alternating two X objects: auto must not thrash (cold loops, paired).
    calls = 20 if ctx.quick else 50
    alternating = [(params[i % len(params)], X if i % 2 else X2, y) for i in range(calls)]
    alt = {"auto": [], "jax.jit": []}
    for r in range(5 if ctx.quick else 9):
        for k in (("auto", "jax.jit") if r % 2 else ("jax.jit", "auto")):
            alt[k].append(_loop_seconds(makers[k], alternating))
    # Steady state per call after WARM_CALLS calls: auto against explicit,
    # and where folding removes nothing, against jax.jit; then jax.jit on
    # the ridge loss, on its own (ten times slower, it would slow whichever
    # variant runs after it).
    steady = {}
    plain_auto = pejit(programs.plain_loss, constant_argnums="auto")
    sampling = {"promoted": (0.005, ctx.paired_rounds), "plain": (ctx.min_seconds, ctx.rounds),
                "jax.jit": (ctx.min_seconds, ctx.repeat)}
    for name, pairs in (("promoted", {k: makers[k]() for k in ("auto", "explicit")}),
                        ("plain", {"auto": plain_auto,
                                   "jax.jit": jax.jit(programs.plain_loss)}),
                        ("jax.jit", {"jax.jit": makers["jax.jit"]()})):
        for fn in pairs.values():
            for p in params[:WARM_CALLS]:
                fn(p, X, y)
        cycle = {k: itertools.cycle(params[WARM_CALLS:]) for k in pairs}
        fns = {k: (lambda fn=fn, c=cycle[k]: fn(next(c), X, y)) for k, fn in pairs.items()}
        min_seconds, repeat = sampling[name]
        steady[name] = rounds(fns, min_seconds=min_seconds, repeat=repeat)
    steady["promoted"] |= steady.pop("jax.jit")
    med = {k: {v: statistics.median(r[key] for r in rs) for v, rs in first.items()}
           for k, key in (("total", "seconds"), ("first", "first_seconds"))}
    return {
        "calls": FIRST_CALLS, "first_calls": first, "first_totals": med["total"], "first_call": med["first"],
        "alternating_calls": calls, "alternating": {k: statistics.median(v) for k, v in alt.items()},
        "alternating_ratio": statistics.median(a / b for a, b in zip(alt["auto"], alt["jax.jit"])),
        "warm_calls": WARM_CALLS,
        "promoted": {k: statistics.median(v) for k, v in steady["promoted"].items()},
        "promoted_ratio": paired_ratios(steady["promoted"], "explicit")["auto"],
        "promoted_excess": statistics.median(a - e for a, e in zip(steady["promoted"]["auto"],
                                                                   steady["promoted"]["explicit"])),
        "plain": {k: statistics.median(v) for k, v in steady["plain"].items()},
        "plain_ratio": paired_ratios(steady["plain"], "jax.jit")["auto"],
        "decisions": {str(k): v for k, v in plain_auto.decisions().items()},
        "max_abs_error": errors,
    }


#: (points per axis, basis functions) of the PDE case: folds in well under
#: a minute here (full: a larger grid), peak RSS well under 1 GB
PDE_SIZE = {True: (6, 100), False: (8, 150)}
#: The sizes TFC's users run, in the full mode: its own example (WaveEquation2D,
#: 11^3 points, 650 functions) and a larger one, so that the fold's cost
#: growth is measured: first result, per call and peak RSS of every variant
PDE_FULL_SIZES = {"full": (11, 650), "large": (15, 1000)}
#: TFC's example as its author wrote it (``pejit.bench._tfc.wave_problem``),
#: beside the bench's formulation: at the quick or main size
#: (``wave2d``) and, in the full mode, at its own size (``wave2d_full``) and the larger one
#: (``wave2d_large``)
PDE_EXAMPLE = {"wave2d": None, "wave2d_full": PDE_FULL_SIZES["full"], "wave2d_large": PDE_FULL_SIZES["large"]}


#: Fresh processes per variant at the full sizes, interleaved: one slow
#: process (a shared machine drifts by tens of percent) must not decide a
#: target. TFC's own fold, several times slower and far from its targets,
#: runs once.
FULL_SIZE_REPEAT = {"pejit_call": 3, "pejit": 3, "jax.jit": 3, "tfc": 1}


def _first_results(ctx: Context, n: int, m: int, repeat: dict[str, int], per_call: float = 0.0,
                   problem: str = "bench") -> dict:
    """Median first result and peak RSS of each variant, ``repeat[variant]``
    fresh processes, interleaved; with ``per_call`` seconds, also each one's
    time per call; and pejit's fold breakdown. ``problem`` names the
    formulation (``pejit.bench._tfc.PDE_PROBLEMS``)."""
    cold: dict[str, list] = {v: [] for v in repeat}
    for r in range(max(repeat.values())):
        for v in (v for v, times in repeat.items() if r < times):
            spec = {"case": "pde_fold", "n": n, "m": m, "variant": v, "per_call": per_call, "problem": problem}
            cold[v].append(ctx.tfc("pejit.bench._tfc", spec))
    out = {}
    for v, rs in cold.items():
        ok = [r for r in rs if r and "seconds" in r]
        keys = ("seconds", "peak_bytes", "peak_increase_bytes") + (("per_call_seconds",) if per_call else ())
        out[v] = {k: statistics.median(r[k] for r in ok) if ok and k in ok[0] else None for k in keys}
        out[v]["samples"] = [r["seconds"] for r in ok]
        if ok and "breakdown" in ok[-1]:
            out[v]["breakdown"] = ok[-1]["breakdown"]
    return out


def case9(ctx: Context) -> dict:
    """TFC PDE: the 3-D wave equation least squares on TFC's own mtfc basis, vs TFC's pejit and jax.jit."""
    from ._tfc import PDE_VARIANTS

    n, m = PDE_SIZE[ctx.quick]
    if ctx.tfc_python is None:
        return {"n": n, "m": m, "error": "TFC not installed"}
    spec = {"n": n, "m": m, "min_seconds": ctx.min_seconds, "rounds": ctx.rounds}
    steady = ctx.tfc("pejit.bench._tfc", {"case": "pde", **spec})
    repeat = ctx.cold_repeat or 1
    fold = _first_results(ctx, n, m, dict.fromkeys(PDE_VARIANTS, repeat))
    print(f"  pde n={n} m={m}: " + ", ".join(f"{v} first result {_s(f['seconds'])}" for v, f in fold.items()),
          flush=True)
    out = {"n": n, "m": m, "steady": steady, "fold": fold, "repeat": repeat}
    example = _first_results(ctx, n, m, dict.fromkeys(PDE_VARIANTS, repeat), problem="wave2d")
    print(f"  wave2d n={n} m={m}: " + ", ".join(f"{v} first result {_s(f['seconds'])}"
                                               for v, f in example.items()), flush=True)
    out["wave2d"] = {"n": n, "m": m, "fold": example, "problem": "wave2d"}
    if not ctx.quick:
        sizes = [(size, fn, fm, "bench") for size, (fn, fm) in PDE_FULL_SIZES.items()]
        sizes.insert(1, ("wave2d_full", *PDE_EXAMPLE["wave2d_full"], "wave2d"))
        sizes.append(("wave2d_large", *PDE_EXAMPLE["wave2d_large"], "wave2d"))
        sizes = [s for s in sizes if ctx.pde_sizes is None or s[0] in ctx.pde_sizes]
        for size, fn, fm, problem in sizes:
            fold = _first_results(ctx, fn, fm, FULL_SIZE_REPEAT, per_call=1.0, problem=problem)
            print(f"  pde {size} n={fn} m={fm}: " + ", ".join(
                f"{v} first result {_s(f['seconds'])}, per call {_s(f.get('per_call_seconds'))}"
                for v, f in fold.items()), flush=True)
            out[size] = {"n": fn, "m": fm, "fold": fold, "problem": problem}
    return out


_JAX_CACHE = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def persistent_cache(ctx: Context, n: int, m: int, variants: tuple[str, ...]) -> dict:
    """First result in fresh processes: without the cache, cold cache, warm cache."""
    out: dict[str, Any] = {}
    for variant in variants:
        runs: dict[str, list] = {"off": [], "cold": [], "warm": []}
        disk, folded = [], []
        for _ in range(ctx.cold_repeat or 1):
            with tempfile.TemporaryDirectory() as where:
                spec = {"case": "pde_fold", "n": n, "m": m, "variant": variant}
                for mode in ("off", "cold", "warm"):
                    # JAX's persistent compilation cache is on in every mode
                    # (cold in the first two): it saves the residual's compile
                    env = dict(_JAX_CACHE, JAX_COMPILATION_CACHE_DIR=os.path.join(where, f"jax-{mode == 'off'}"),
                               PEJIT_CACHE_DIR="" if mode == "off" else os.path.join(where, "pejit"))
                    runs[mode].append(ctx.tfc_env("pejit.bench._tfc", spec, env))
                disk.append(_dir_bytes(os.path.join(where, "pejit")))
                folded.append(runs["cold"][-1].get("folded_bytes"))
        seconds = {k: [r.get("seconds") for r in v] for k, v in runs.items()}
        print(f"  {variant} n={n} m={m}: " + ", ".join(f"{k} {[_s(t) for t in v]}" for k, v in seconds.items()),
              flush=True)
        out[variant] = {"seconds": seconds, "disk_bytes": disk, "folded_bytes": folded,
                        "checksums": {k: [r.get("checksum") for r in v] for k, v in runs.items()}}
    return out


def case10(ctx: Context) -> dict:
    """Persistent cache: a second process's first result on the PDE of case 9 (and full-size WaveEquation2D)."""
    if ctx.tfc_python is None:
        return {"error": "TFC not installed"}
    n, m = PDE_SIZE[ctx.quick]
    result = {"n": n, "m": m, "case9": persistent_cache(ctx, n, m, ("pejit", "pejit_call"))}
    if not ctx.quick:
        result["full"] = persistent_cache(ctx, *PDE_FULL_SIZES["full"], ("pejit", "pejit_call"))
    return result



def case11(ctx: Context) -> dict:
    """Chain of three constant matrices on a dynamic vector, vs the hand-folded single product (n = 512)."""
    n = 512
    rng = np.random.default_rng(10)
    C1, C2, C3 = (jnp.asarray(rng.standard_normal((n, n)) / np.sqrt(n), jnp.float32) for _ in range(3))
    x = jnp.asarray(rng.standard_normal(n), jnp.float32)

    def chain(c1, c2, c3, x):
        return c1 @ (c2 @ (c3 @ x))

    call_time = pejit(chain, constant_argnums=(0, 1, 2))
    tfc_form = pejit(C1, C2, C3, x, constant_arg_nums=[0, 1, 2])(chain)
    M = jax.block_until_ready(C1 @ (C2 @ C3))
    hand = jax.jit(lambda m, x: m @ x)
    fns = {
        "pejit_calltime": lambda: call_time(C1, C2, C3, x),
        "pejit": lambda: tfc_form(x),
        "hand": lambda: hand(M, x),
        "jax.jit": (lambda f: lambda: f(C1, C2, C3, x))(jax.jit(chain)),
    }
    c64 = [np.asarray(c, np.float64) for c in (C1, C2, C3)]
    exact = c64[0] @ (c64[1] @ (c64[2] @ np.asarray(x, np.float64)))
    scale = float(np.max(np.abs(exact)))
    errors = {k: float(np.max(np.abs(np.asarray(f(), np.float64) - exact))) / scale for k, f in fns.items()}
    samples = rounds(fns, min_seconds=ctx.min_seconds, repeat=ctx.rounds)
    return {
        "n": n,
        "times": {k: statistics.median(v) for k, v in samples.items()},
        "ratios": paired_ratios(samples, "hand"),
        "max_rel_error_vs_float64": errors,
        "residual": dict(call_time.report(C1, C2, C3, x).residual),
    }


#: (collocation points, basis functions) of the nonlinear ODE case
ODE_SIZE = {True: (100, 30), False: (200, 60)}


def case12(ctx: Context) -> dict:
    """TFC's nonlinear ODE (y'' + y y' = f): one Gauss-Newton step per call, vs TFC's pejit."""
    points, m = ODE_SIZE[ctx.quick]
    if ctx.tfc_python is None:
        return {"points": points, "m": m, "error": "TFC not installed"}
    spec = {"points": points, "m": m, "min_seconds": ctx.min_seconds, "rounds": ctx.rounds}
    return {"points": points, "m": m, "steady": ctx.tfc("pejit.bench._tfc", {"case": "ode", **spec})}


CASES = {1: case1, 2: case2, 3: case3, 4: case4, 5: case5, 6: case6, 7: case7, 8: case8, 9: case9,
         10: case10, 11: case11, 12: case12, 13: loops.case13, 14: loops.case14,
         15: loops.case15, 16: gradients.case16}
