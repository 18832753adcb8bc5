"""RESULTS.md and plots."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from pathlib import Path

import jax
import numpy as np

from .. import _compat
from . import gradients, loops
from ._common import _s, mib
from .cases import Context
from .targets import Target

NAMES = {
    "jit_args": "jax.jit, constants as arguments",
    "jit_closed": "jax.jit, constants closed over",
    "tfc": "TFC pejit",
    "pejit": "pejit",
    "pejit_call": "pejit, call-time form",
    "hand": "hand-folded",
}


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    devices = ", ".join(sorted({d.device_kind for d in jax.devices()}))
    return f"{platform.node()}: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; devices: {devices}"


def write(out: Path, name: str, ctx: Context, results: dict, targets: list[Target], errors: dict,
          plots: bool = True) -> None:
    lines = [
        "# pejit benchmark results",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {_machine()}",
        f"- JAX {_compat.JAX_VERSION}, jaxlib {_compat.JAXLIB_VERSION}, backend {jax.default_backend()}",
        f"- mode: {'quick' if ctx.quick else 'full'}; TFC: {ctx.tfc_python or 'not installed (n/a)'}",
        f"- XLA_FLAGS: `{os.environ.get('XLA_FLAGS', '')}`",
        f"- load average when written (1/5/15 min): {' / '.join(f'{x:.1f}' for x in os.getloadavg())}"
        " (the machine is shared; ratios are measured side by side for that reason)",
        "- command: `" + shlex.join(["python", "-m", "pejit.bench", *sys.argv[1:]]) + "`",
        "",
        "Steady-state times are medians of interleaved samples in one process;",
        "the steady-state targets use the median of ratios paired by round (each pair",
        "sampled back to back; case 1 on four constant sets, since buffer placement",
        "moves a matrix-vector product by 10-20%);",
        "fold, compile and memory figures come from a fresh process per sample;",
        "TFC runs in its own process (it turns on 64-bit mode globally).",
        "",
        "## Targets",
        "",
    ]
    for t in targets:
        mark = "PASS" if t.passed else "FAIL" if t.passed is not None else "n/a"
        lines.append(f"- **{mark}** {t.name}: {t.detail}")
    lines.append("")
    for number, res in results.items():
        lines += SECTIONS[number](res)
        lines.append("")
    for number, error in errors.items():
        lines += [f"## Case {number}: failed", "", "```", error.strip()[-3000:], "```", ""]
    (out / name).write_text("\n".join(lines))
    if not plots:
        return
    try:
        _plots(out, Path(name).stem, results)
    except ImportError:
        print("matplotlib not installed: no plots (pip install pejit[bench])")


def _times_table(times: dict, ref: str) -> list[str]:
    rows = ["| variant | time per call | / " + NAMES.get(ref, ref) + " |", "|---|---|---|"]
    for k, t in times.items():
        ratio = f"{t / times[ref]:.3f}" if t is not None and times.get(ref) else "n/a"
        rows.append(f"| {NAMES.get(k, k)} | {_s(t)} | {ratio} |")
    return rows


def _case1(r):
    return ["## Case 1: linsolve (n = 1000, float32)", "", *_times_table(r["times"], "hand"), "",
            f"Max abs difference from hand-folded, relative to its largest entry: {r['max_abs_error']}"]


def _case2(r):
    lines = [f"## Case 2: basis (Chebyshev, {r['points']} points, degree {r['degree']})", "",
             *_times_table(r["times"], "hand"), "", f"Max abs difference from hand-folded, relative to its largest entry: {r['max_abs_error']}"]
    u = r.get("utfc")
    if u and "times" in u:
        lines += ["", "TFC's `utfc` basis (in the TFC process, 64-bit mode on):", "",
                  *_times_table(u["times"], "hand"), "", f"Max abs difference: {u['max_abs_error']}"]
    else:
        lines += ["", f"TFC's `utfc` basis: n/a {u.get('error', '') if u else ''}"]
    return lines


def _case3(r):
    t = r["times"]
    lines = [f"## Case 3: PLN (n = 11600, p = 114, d = 1, {r['iterations']} iterations, Adam)", "",
             "| variant | time per iteration |", "|---|---|"]
    lines += [f"| {k} | {_s(v)} |" for k, v in t.items()]
    lines += ["", f"pejit_step / hand_step = {t['pejit_step'] / t['hand_step']:.3f}; "
              f"pejit_scan / hand_scan = {t['pejit_scan'] / t['hand_scan']:.3f}; "
              f"jit_step / pejit_step = {t['jit_step'] / t['pejit_step']:.3f}", "",
              f"ELBO trajectories, max relative difference from jit_step: {r['elbo_max_rel_diff']}"]
    if r.get("tfc_error"):
        lines += ["", f"TFC pejit: n/a ({r['tfc_error']})"]
    return lines


def _case4(r):
    rows = r["fold_seconds"]
    variants = list(next(iter(rows.values())))
    lines = [f"## Case 4: fold time (seconds to first result, median of {r['repeat']} fresh processes)", "",
             "Chain: sin, *1.0001, +0.5, cos, repeated; then `+ x` with `x` dynamic (NumPy constant,"
             " call-time form). `sin_chain`: issue 48's, `c = sin(c) * 1.001 + 0.5` K times, then `c @ x`"
             " (`jax.Array` constant, TFC form).", "",
             "| N x K | " + " | ".join(variants) + " | pejit / min(TFC, one program) |",
             "|---|" + "---|" * (len(variants) + 1)]
    for point, row in rows.items():
        best = min(v for k, v in row.items() if k in ("tfc", "one_program") and v is not None)
        lines.append(f"| {point} | " + " | ".join(_s(row.get(v)) for v in variants) + f" | {row['pejit'] / best:.2f} |")
    return lines


def _case5(r):
    lines = ["## Case 5: compile time and peak memory vs folded size (`cos(A) @ x`)", "",
             "Compile = lower + compile of the residual program; fold = from `pejit(...)` to the folded constants.", "",
             "| n | folded | pejit fold | pejit compile | pejit peak RSS increase | TFC fold | TFC compile | TFC peak RSS increase |",
             "|---|---|---|---|---|---|---|---|"]
    for n, row in r["sizes"].items():
        p, t = row["pejit"], row.get("tfc") or {}
        lines.append(f"| {n} | {mib(p['folded_bytes'])} | {_s(p['fold_s'])} | {_s(p['compile_s'])} | "
                     f"{mib(p['peak_increase_bytes'])} | {_s(t.get('fold_s'))} | {_s(t.get('compile_s'))} | "
                     f"{mib(t.get('peak_increase_bytes'))} |")
    return lines


def _case6(r):
    t = r["times"]
    rows = ["## Case 6: dispatch on tiny inputs", "", "| variant | per call | / jax.jit |", "|---|---|---|"]
    rows += [f"| {k} | {v * 1e6:.1f} us | {v / t['jax.jit']:.2f} |" for k, v in t.items()]
    return rows


def _case7(r):
    lines = [f"## Case 7: multi-host (`jax.distributed`, 2 CPU devices per process; {r['n']} x {r['n']} float32"
             f" constant row-sharded over all devices)", "",
             "Fold = first value (traces and compiles the folding program); refold = a second value of the same"
             " structure, folded by that program; peak = how far the process's RSS rose above its level before"
             " (high-water mark); peak RSS = over the process's life, JAX's runtime included. Largest over the"
             " processes.", "",
             "| processes | constant per process | fold | peak while folding | refold | peak while refolding | peak RSS |",
             "|---|---|---|---|---|---|---|"]
    for processes, row in r["processes"].items():
        lines.append(f"| {processes} | {mib(row['held_bytes'])} of {mib(row['constant_bytes'])} | {_s(row['fold_s'])} | "
                     f"+{mib(row['fold_peak_bytes'])} | {_s(row['refold_s'])} | +{mib(row['refold_peak_bytes'])} | "
                     f"{mib(row['peak_rss_bytes'])} |")
    return lines


def _case8(r):
    t, f = r["first_totals"], r["first_call"]
    rows = [f"## Case 8: automatic constants (`constant_argnums=\"auto\"`), `ridge_loss`", "",
            f"The first {r['calls']} calls, each variant in a fresh process (from creating the function; "
            f"medians of {len(r['first_calls']['auto'])} rounds):", "",
            f"| variant | first {r['calls']} calls | first call |", "|---|---|---|"]
    rows += [f"| {k} | {_s(v)} | {_s(f[k])} |" for k, v in t.items()]
    a, p, q = r["alternating"], r["plain"], r["promoted"]
    rows += ["", f"After {r['warm_calls']} warm calls, per call: auto {_s(q['auto'])}, explicit {_s(q['explicit'])} "
             f"(paired ratio {r['promoted_ratio']:.3f}), jax.jit {_s(q['jax.jit'])}.",
             "", f"Alternating two `X` objects, {r['alternating_calls']} calls: auto {_s(a['auto'])}, "
             f"jax.jit {_s(a['jax.jit'])} (paired ratio {r['alternating_ratio']:.3f}).", "",
             f"Nothing to fold (`plain_loss`), per call: auto {p['auto'] * 1e6:.1f} us, jax.jit "
             f"{p['jax.jit'] * 1e6:.1f} us (paired ratio {r['plain_ratio']:.3f}); decisions: {r['decisions']}", "",
             f"Max abs difference from jax.jit (third call), relative: {r['max_abs_error']}"]
    return rows


def _case9(r):
    lines = [f"## Case 9: TFC PDE least squares (mtfc, {r['n']}^3 points, {r['m']} ELM basis functions)", "",
             "The 3-D wave equation through nested `egrad`, one `lstsq(jacfwd(L), L)` step, the",
             "coordinates constant; all variants run in the TFC process (64-bit mode). Fold time",
             "and peak RSS: a fresh process per variant, from `pejit(...)` to the first result.",
             "Two formulations: the bench's (`pejit.bench._tfc.pde_problem`: zeros and ones as NumPy",
             "arrays built once) and TFC's example as its author wrote it (`wave_problem`,",
             "WaveEquation2D.py: `jnp.zeros_like`/`ones_like` inside the function, TFC's `LS` step)."]
    steady = r.get("steady") or {}
    if "times" in steady:
        lines += ["", *_times_table(steady["times"], "tfc"), "",
                  f"Paired ratios: {', '.join(f'{k} {v:.3f}' for k, v in steady['ratios'].items())}; "
                  f"max relative difference from TFC: {steady['max_rel_error_vs_tfc']}"]
    else:
        lines += ["", f"Per call: n/a {steady.get('error', r.get('error', ''))[:300]}"]
    titles = {"wave2d": ", TFC's example as written (WaveEquation2D.py)",
              "full": " at TFC's size", "wave2d_full": ", TFC's example as written (WaveEquation2D.py), at its size",
              "large": " at a larger size", "wave2d_large": ", TFC's example as written, at the larger size"}
    sizes = [("", "", r.get("fold"))] + [
        (titles[size], f" ({r[size]['n']}^3 points, {r[size]['m']} functions)", r[size].get("fold"))
        for size in titles if r.get(size)]
    for title, size, rows in sizes:
        if not rows:
            continue
        lines += ["", f"First result{title}{size}: fold + compile + first call, median of fresh processes"
                  " (`pejit` is the TFC form `pejit(xi, *x, constant_arg_nums=[1, 2, 3])(step)`;"
                  " `jax.jit` compiles `step` with the grid as arguments); per call after it, in the same"
                  " process.", "",
                  "| variant | first result | samples | per call | peak RSS | peak RSS increase |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {NAMES.get(v, v)} | {_s(f['seconds'])} | {', '.join(_s(t) for t in f.get('samples', []))} | "
                  f"{_s(f.get('per_call_seconds'))} | {mib(f['peak_bytes'])} | {mib(f['peak_increase_bytes'])} |"
                  for v, f in rows.items()]
        for v, f in rows.items():
            if f.get("breakdown"):
                lines += ["", *_breakdown(NAMES.get(v, v), f["breakdown"])]
    return lines


def _breakdown(name: str, b: dict) -> list[str]:
    """Where a fold's time went: tracing and folding, then each batch of known work."""
    batches = sum(row["seconds"] for row in b["batches"])
    lines = [f"{name}: trace and fold {_s(b['fold_seconds'])}, of which batches {_s(batches)} and the rest"
             f" (tracing, finalizing, collapsing; in the call-time form, its first value)"
             f" {_s(b['fold_seconds'] - batches)}"
             f" (log: {'; '.join(b.get('stages', []))}), residual"
             f" {b['residual_equations']} equations ({'; '.join(b['collapsed']) or 'nothing collapsed'}).", "",
             "| batch | equations | seconds | of which compiling | log |", "|---|---|---|---|---|"]
    lines += [f"| {i} | {row['equations']} | {_s(row['seconds'])} | {_s(row['compile_seconds'])} | "
              f"{row.get('log', '')} |" for i, row in enumerate(b["batches"])]
    lines += [f"| first value, segment {i} | | | | {line} |" for i, line in enumerate(b.get("first_value", []))]
    return lines


def _case10(r):
    lines = ["## Case 10: persistent cache, a second process's first result",
             "", "Each run a fresh process, JAX's persistent compilation cache on in all three:",
             "*off* (`PEJIT_CACHE_DIR=`), *cold* (empty pejit cache), *warm* (the cold run's caches);",
             "pejit is the TFC form `pejit(xi, *x, constant_arg_nums=[1, 2, 3])(step)`.",
             "", "| size | variant | off | cold | warm | disk / folded bytes |", "|---|---|---|---|---|---|"]
    for size in ("case9", "full"):
        for variant, row in (r.get(size) or {}).items():
            cells = [", ".join(_s(t) for t in row["seconds"][k]) for k in ("off", "cold", "warm")]
            ratios = [f"{d / f:.3f}" for d, f in zip(row["disk_bytes"], row["folded_bytes"]) if f]
            lines.append(f"| {size} | {NAMES.get(variant, variant)} | {' | '.join(cells)} | {', '.join(ratios)} |")
    return lines


def _case11(r):
    return [f"## Case 11: a chain of three constant {r['n']}x{r['n']} matrices on a dynamic vector", "",
            "`C1 @ (C2 @ (C3 @ x))`, float32; hand-folded: `(C1 @ C2 @ C3) @ x` with the product made",
            f"by hand. pejit's residual: {r['residual']}.", "", *_times_table(r["times"], "hand"), "",
            f"Paired ratios to hand-folded: {', '.join(f'{k} {v:.3f}' for k, v in r['ratios'].items())}; "
            f"max relative difference from float64 NumPy: {r['max_rel_error_vs_float64']}"]


def _case12(r):
    lines = [f"## Case 12: TFC's nonlinear ODE ({r['points']} points, {r['m']} Chebyshev functions)", "",
             "`y'' + y y' = f` on [0, pi] through `utfc` and `egrad`, one `lstsq(jacfwd(L), L)` step per",
             "call, the points constant; all variants in the TFC process (64-bit)."]
    steady = r.get("steady") or {}
    if "times" in steady:
        lines += ["", *_times_table(steady["times"], "tfc"), "",
                  f"Paired ratios: {', '.join(f'{k} {v:.3f}' for k, v in steady['ratios'].items())}; "
                  f"max relative difference from TFC: {steady['max_rel_error_vs_tfc']}; after 8 steps, "
                  f"max error vs the exact solution: {steady['max_error_vs_exact_solution']}; "
                  f"collapsed: {steady['collapsed']}"]
    else:
        lines += ["", f"Per call: n/a {steady.get('error', r.get('error', ''))[:300]}"]
    return lines


SECTIONS = {1: _case1, 2: _case2, 3: _case3, 4: _case4, 5: _case5, 6: _case6, 7: _case7, 8: _case8, 9: _case9,
            10: _case10, 11: _case11, 12: _case12, 13: loops.section13, 14: loops.section14,
            15: loops.section15, 16: gradients.section16}


def _plots(out: Path, stem: str, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steady = [(n, results[n]["times"]) for n in (1, 2) if n in results]
    if steady:
        fig, axes = plt.subplots(1, len(steady), figsize=(5 * len(steady), 3.5))
        for ax, (n, times) in zip(np.atleast_1d(axes), steady):
            names = [k for k, v in times.items() if v is not None]
            ax.barh([NAMES.get(k, k) for k in names], [times[k] * 1e3 for k in names])
            ax.set_xscale("log")
            ax.set_xlabel("ms per call (log)")
            ax.set_title(f"case {n}")
        fig.tight_layout()
        fig.savefig(out / f"{stem}-steady.png", dpi=100)
        plt.close(fig)
    if 3 in results:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for k, v in results[3]["elbo"].items():
            ax.plot(v, label=k)
        ax.set_yscale("log")
        ax.set_xlabel("iteration")
        ax.set_ylabel("negative ELBO")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{stem}-pln.png", dpi=100)
        plt.close(fig)
    if 4 in results:
        rows = results[4]["fold_seconds"]
        variants = list(next(iter(rows.values())))
        fig, ax = plt.subplots(figsize=(7, 3.5))
        width = 0.8 / len(variants)
        for i, v in enumerate(variants):
            ax.bar([j + i * width for j in range(len(rows))], [rows[p].get(v) or 0 for p in rows], width, label=v)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], list(rows))
        ax.set_ylabel("seconds to first result")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"{stem}-fold.png", dpi=100)
        plt.close(fig)
    if 5 in results:
        sizes = results[5]["sizes"]
        ns = list(sizes)
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
        for who in ("pejit", "tfc"):
            pts = [(n, sizes[n].get(who)) for n in ns if sizes[n].get(who) and "compile_s" in sizes[n][who]]
            if pts:
                a1.plot([n for n, _ in pts], [p["compile_s"] for _, p in pts], "o-", label=who)
                a2.plot([n for n, _ in pts], [p["peak_increase_bytes"] / 2**20 for _, p in pts], "o-", label=who)
        a2.plot(ns, [2 * sizes[n]["pejit"]["folded_bytes"] / 2**20 for n in ns], "k--", label="2x folded")
        for a, lab in ((a1, "compile seconds"), (a2, "peak RSS increase (MiB)")):
            a.set_xscale("log")
            a.set_yscale("log")
            a.set_xlabel("n")
            a.set_ylabel(lab)
            a.legend()
        fig.tight_layout()
        fig.savefig(out / f"{stem}-compile.png", dpi=100)
        plt.close(fig)



