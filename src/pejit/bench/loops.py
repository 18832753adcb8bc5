"""The call path as users meet it: what a cached call costs, by argument kind, and
the loops users write (an Optax training step, an HMC step, a BlackJAX kernel).

A cached call's cost over ``jax.jit``'s is a few microseconds in a call of
ten, so each figure is a median of paired rounds, as case 8's: in each
round the pejit function and ``jax.jit`` run back to back (the order
alternating), and the round's difference (or ratio) is one sample.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pejit import pejit

from ._common import paired


# -- case 13: what a cached call costs, by argument kind -----------------------------
class Pair(NamedTuple):
    a: jax.Array
    b: jax.Array


@functools.partial(jax.tree_util.register_dataclass, data_fields=["w", "b"], meta_fields=[])
@dataclasses.dataclass
class State:
    w: jax.Array
    b: jax.Array


def _kinds(n: int, seed: int) -> dict[str, tuple]:
    """Dynamic arguments of each kind: (positional, keywords, jax.jit keywords);
    other values (of the same types) for another ``seed``."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal(n).astype(np.float32))
    y = x + 1
    s = float(seed) + 0.5
    return {
        "bare arrays": ((x,), {}, {}),
        "a dict of two arrays": (({"a": x, "b": y},), {}, {}),
        "a NamedTuple": ((Pair(x, y),), {}, {}),
        "a register_dataclass state": ((State(x, y),), {}, {}),
        "a typed PRNG key": ((jax.random.key(seed),), {}, {}),
        "a raw PRNG key": ((jax.random.PRNGKey(seed),), {}, {}),
        "a Python float": ((x, s), {}, {}),
        "a NumPy scalar": ((x, np.float32(s)), {}, {}),
        "a NumPy array": ((np.asarray(x),), {}, {}),
        "a keyword argument": ((x,), {"z": y}, {}),
        "a static argument": ((x, 3), {}, {"static_argnums": 2}),
        "a list of 8 arrays": (([x + i for i in range(8)],), {}, {}),
        "mixed (dict with key and float, NumPy array, keyword NamedTuple)":
            (({"k": jax.random.key(seed), "s": s}, np.asarray(y)), {"z": Pair(x, y)}, {}),
    }


def _alternating(fn: Callable, calls: list[tuple]) -> Callable[[], Any]:
    """A call of ``fn`` on each of ``calls`` (positional, keywords) in turn: values
    change from call to call, as in a loop (and under auto, stay dynamic)."""
    turn = itertools.cycle([functools.partial(fn, *args, **kwargs) for args, kwargs in calls])
    return lambda: next(turn)()


def _product(S, *args, **kwargs):
    """``S @ v + s``: ``v`` the first vector among the dynamic leaves (or drawn
    from a key), ``s`` the sum of the others. The call itself is tiny, and the
    program is the same under pejit as under ``jax.jit`` (nothing to fold)."""
    n = S.shape[1]
    vector, scalar = None, 0.0
    for leaf in jax.tree_util.tree_leaves((args, kwargs)):
        leaf = jnp.asarray(leaf)
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key) or (leaf.dtype == jnp.uint32 and leaf.shape == (2,)):
            leaf = jax.random.normal(leaf, (n,))
        if vector is None and leaf.shape == (n,):
            vector = leaf
        else:
            scalar = scalar + jnp.sum(leaf)
    return S @ vector + scalar


#: The dispatch table's forms: the call-time form, the TFC form, and auto
#: (promoting the constant on its second call: the product is too small to
#: pass the default FLOP threshold).
FORMS = ("call-time form", "TFC form", "auto")


def _form(form: str, S, args: tuple, jit_kwargs: dict) -> Callable | None:
    if form == "call-time form":
        return functools.partial(pejit(_product, constant_argnums=0, **jit_kwargs), S)
    if form == "auto":
        return functools.partial(pejit(_product, constant_argnums="auto", auto_min_flops=0, **jit_kwargs), S)
    static = {"static_argnums": tuple(i - 1 for i in np.atleast_1d(jit_kwargs["static_argnums"]))} if jit_kwargs else {}
    return pejit(S, *args, constant_arg_nums=[0], **static)(_product)


def case13(ctx) -> dict:
    """Dispatch: a cached call of ``S @ v`` (S 64x64 constant) against jax.jit's, by argument kind."""
    n = 64
    S = jnp.asarray(np.random.default_rng(1).standard_normal((n, n)).astype(np.float32))
    calls_per_sample, pairs = (100, 41) if ctx.quick else (200, 101)
    table: dict[str, dict] = {}
    for kind, (args, kwargs, jit_kwargs) in _kinds(n, 0).items():
        other, other_kwargs, _ = _kinds(n, 1)[kind]
        calls = [(args, kwargs), (other, other_kwargs)]
        jitted = jax.jit(_product, **jit_kwargs)
        fns = {"jax.jit": _alternating(functools.partial(jitted, S), calls)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # S @ v folds nothing: the point is the call
            for form in FORMS:
                if form == "TFC form" and kwargs:
                    continue  # the TFC form takes its arguments by position
                fns[form] = _alternating(_form(form, S, args, jit_kwargs), calls)
            want = [np.asarray(fns["jax.jit"]()) for _ in calls]
            for form, fn in fns.items():
                for w in want:
                    np.testing.assert_allclose(np.asarray(fn()), w, rtol=1e-5, err_msg=f"{kind}, {form}")
            r = paired(fns, "jax.jit", calls_per_sample, pairs)
        table[kind] = r
        print(f"  {kind}: jax.jit {r['times']['jax.jit'] * 1e6:.1f} us; "
              + ", ".join(f"{form} {e * 1e6:+.1f} us" for form, e in r["extra"].items()), flush=True)
    return {"n": n, "calls": calls_per_sample, "pairs": pairs, "table": table}


# -- case 14: the loops users write --------------------------------------------------
def _adam_step(optimizer, apply_updates):
    def step(params, opt_state, X, y):
        def loss(p):
            Z = (X - X.mean(0)) / X.std(0)  # the features, standardized: constant work
            h = jnp.tanh(Z @ p["w1"] + p["b1"])
            return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return apply_updates(params, updates), opt_state, value

    return step


def _optax(ctx) -> dict:
    import optax

    rng = np.random.default_rng(2)
    n, d, h = (512, 16, 32) if ctx.quick else (2048, 32, 64)
    X = jnp.asarray(rng.standard_normal((n, d)).astype(np.float32) * 3 + 1)
    y = jnp.asarray(rng.standard_normal((n, 1)).astype(np.float32))
    params = {"w1": jnp.asarray(rng.standard_normal((d, h)).astype(np.float32) * 0.1), "b1": jnp.zeros(h),
              "w2": jnp.asarray(rng.standard_normal((h, 1)).astype(np.float32) * 0.1), "b2": jnp.zeros(1)}
    optimizer = optax.adam(1e-3)
    step = _adam_step(optimizer, optax.apply_updates)
    variants = {"jax.jit": jax.jit(step), "pejit": pejit(step, constant_argnums=(2, 3)),
                "pejit auto": pejit(step, constant_argnums="auto")}
    return _loop(variants, lambda fn: _trainer(fn, params, optimizer.init(params), X, y), ctx)


def _trainer(fn, params, opt_state, X, y):
    state = [params, opt_state]

    def one():
        state[0], state[1], value = fn(state[0], state[1], X, y)
        return value

    return one


def _hmc_step(num_steps: int, step_size: float):
    def step(key, q, Sigma):
        L = jnp.linalg.cholesky(Sigma)  # constant: folded by pejit

        def potential(q):
            z = jax.scipy.linalg.solve_triangular(L, q, lower=True)
            return 0.5 * z @ z

        grad = jax.grad(potential)
        k1, k2 = jax.random.split(key)
        p0 = jax.random.normal(k1, q.shape)

        def leapfrog(_, qp):
            q, p = qp
            p = p - 0.5 * step_size * grad(q)
            q = q + step_size * p
            return q, p - 0.5 * step_size * grad(q)

        q1, p1 = jax.lax.fori_loop(0, num_steps, leapfrog, (q, p0))
        log_accept = potential(q) + 0.5 * p0 @ p0 - potential(q1) - 0.5 * p1 @ p1
        accept = jnp.log(jax.random.uniform(k2)) < log_accept
        return jnp.where(accept, q1, q)

    return step


def _sigma(d: int) -> jax.Array:
    m = np.random.default_rng(3).standard_normal((d, d))
    return jnp.asarray((m @ m.T / d + np.eye(d)).astype(np.float32))


def _hmc(ctx) -> dict:
    d = 60
    Sigma = _sigma(d)
    step = _hmc_step(10, 0.1)
    variants = {"jax.jit": jax.jit(step), "pejit": pejit(step, constant_argnums=2),
                "pejit auto": pejit(step, constant_argnums="auto")}

    def sampler(fn):
        state = [jax.random.key(0), jnp.zeros(d)]

        def one():
            state[0], key = jax.random.split(state[0])
            state[1] = fn(key, state[1], Sigma)
            return state[1]

        return one

    return _loop(variants, sampler, ctx)


def _blackjax(ctx) -> dict:
    import blackjax

    d = 60
    Sigma = _sigma(d)

    def step(key, state, Sigma):
        L = jnp.linalg.cholesky(Sigma)

        def logdensity(q):
            z = jax.scipy.linalg.solve_triangular(L, q, lower=True)
            return -0.5 * z @ z

        kernel = blackjax.hmc(logdensity, step_size=0.1, inverse_mass_matrix=jnp.ones(d), num_integration_steps=10)
        return kernel.step(key, state)[0]

    init = blackjax.hmc.init(jnp.zeros(d), lambda q: -0.5 * q @ jnp.linalg.solve(Sigma, q))
    variants = {"jax.jit": jax.jit(step), "pejit": pejit(step, constant_argnums=2),
                "pejit auto": pejit(step, constant_argnums="auto")}

    def sampler(fn):
        state = [jax.random.key(0), init]

        def one():
            state[0], key = jax.random.split(state[0])
            state[1] = fn(key, state[1], Sigma)
            return state[1].position

        return one

    return _loop(variants, sampler, ctx)


def _loop(variants: dict[str, Callable], make: Callable[[Callable], Callable[[], Any]], ctx) -> dict:
    """Per step of each variant's loop, paired with ``jax.jit``'s (after a warm-up
    in which auto promotes)."""
    loops = {k: make(fn) for k, fn in variants.items()}
    for one in loops.values():
        for _ in range(5):
            one()
    calls, pairs = (20, 41) if ctx.quick else (50, 101)
    return paired(loops, "jax.jit", calls, pairs)


LOOPS = {"Optax Adam step (dataset constant)": _optax,
         "HMC step (typed key, constant 60x60 prior covariance)": _hmc,
         "BlackJAX hmc kernel step (its state object)": _blackjax}


def case14(ctx) -> dict:
    """Loops users write: an Optax training step, an HMC step, a BlackJAX kernel step, per step against jax.jit."""
    out = {}
    for name, run in LOOPS.items():
        try:
            out[name] = run(ctx)
        except ImportError as e:  # the bench extra brings them
            out[name] = {"error": f"{e.name} is not installed"}
            continue
        r = out[name]
        print(f"  {name}: jax.jit {r['times']['jax.jit'] * 1e6:.0f} us per step; "
              + ", ".join(f"{k} {v:.3f}x" for k, v in r["ratio"].items()), flush=True)
    return out


# -- case 15: TFC's PDE step per call, right after the fold --------------------------
def case15(ctx) -> dict:
    """TFC PDE step per call after the fold and steady, both forms, NumPy and jax.Array grids, vs hand-folded."""
    from ._pde_calls import VARIANTS

    n, m = 6, 100
    if ctx.tfc_python is None:
        return {"n": n, "m": m, "error": "TFC not installed"}
    out = {}
    for form, grid in VARIANTS:
        spec = {"case": "pde_calls", "n": n, "m": m, "form": form, "grid": grid, "pairs": 41 if ctx.quick else 101}
        r = out[f"{form}, {grid} grid"] = ctx.tfc("pejit.bench._pde_calls", spec)
        if r and "first" in r:
            print(f"  {form}, {grid} grid: first calls {r['first']['ratio']:.3f}x, steady {r['steady']['ratio']:.3f}x "
                  f"the hand-folded program", flush=True)
    return {"n": n, "m": m, "variants": out}


# -- targets and report sections -------------------------------------------------------
#: Case 15's "right after the fold" (as ``_pde_calls.FIRST_CALLS``, which imports TFC).
FIRST_CALLS_AFTER_FOLD = 1000

#: Microseconds a cached call may cost over jax.jit's: with bare arrays, and with anything else.
BARE_BUDGET_US, OTHER_BUDGET_US = 3.0, 5.0


def targets(results: dict, target: Callable) -> list:
    """Cases 13 and 14's targets, as ``target(name, passed, detail)``."""
    out = []
    if 13 in results:
        for kind, r in results[13]["table"].items():
            budget = BARE_BUDGET_US if kind == "bare arrays" else OTHER_BUDGET_US
            for form, extra in r["extra"].items():
                out.append(target(f"case 13: {kind}, {form}: per call <= jax.jit + {budget:g} us", extra * 1e6 <= budget,
                                  f"{r['times'][form] * 1e6:.1f} us / {r['times']['jax.jit'] * 1e6:.1f} us: "
                                  f"{extra * 1e6:+.1f} us (median of differences paired by round)"))
    for name, r in results.get(14, {}).items():
        if "error" in r:
            out.append(target(f"case 14: {name}", None, r["error"]))
            continue
        # The HMC step's Cholesky is folded: below jax.jit. (Auto promotes
        # nothing in these loops, too little is removed: it is jax.jit itself.)
        below = name.startswith("HMC")
        ratio = r["ratio"]["pejit"]
        out.append(target(f"case 14: {name}, pejit per step {'<' if below else '<='} 1.0x jax.jit's",
                          ratio < 1.0 if below else ratio <= 1.0,
                          f"{r['times']['pejit'] * 1e6:.0f} us / {r['times']['jax.jit'] * 1e6:.0f} us: "
                          f"{ratio:.3f} (median of ratios paired by round)"))
    for name, r in results.get(15, {}).get("variants", {}).items():
        for when, what in (("first", f"the first {FIRST_CALLS_AFTER_FOLD} calls after the fold"), ("steady", "steady")):
            t = (r or {}).get(when)
            out.append(target(f"case 15: {name}, {what}: per call <= 1.0x the hand-folded program",
                              None if t is None else t["ratio"] <= 1.0,
                              "n/a" if t is None else f"{t['pejit'] * 1e6:.1f} us / {t['hand'] * 1e6:.1f} us: "
                              f"{t['ratio']:.3f} (median of ratios paired by call or round)"))
    return out


def section13(r: dict) -> list[str]:
    forms = list(FORMS)
    rows = ["## Case 13: what a cached call costs, by kind of dynamic argument", "",
            f"`S @ v + s`, `S` a 64x64 constant, `v` and `s` from the dynamic arguments (the same program under "
            f"both). Each variant alternates between two argument values; medians over {r['pairs']} rounds of "
            f"{r['calls']} calls each, pejit and jax.jit back to back. Targets: jax.jit + {BARE_BUDGET_US:g} us "
            f"with bare arrays, + {OTHER_BUDGET_US:g} us otherwise.", "",
            "| dynamic arguments | jax.jit | " + " | ".join(f"{f}, extra" for f in forms) + " |",
            "|---|---|" + "---|" * len(forms)]
    for kind, t in r["table"].items():
        cells = [f"{t['extra'][f] * 1e6:+.1f} us" if f in t["extra"] else "n/a (positional only)" for f in forms]
        rows.append(f"| {kind} | {t['times']['jax.jit'] * 1e6:.1f} us | " + " | ".join(cells) + " |")
    return rows


def section14(r: dict) -> list[str]:
    rows = ["## Case 14: loops users write", "",
            "Per step of a Python loop threading its state, after a warm-up in which auto promotes; "
            "medians of paired rounds.", "", "| loop | jax.jit | variant | per step | / jax.jit |", "|---|---|---|---|---|"]
    for name, t in r.items():
        if "error" in t:
            rows.append(f"| {name} | n/a | | {t['error']} | |")
            continue
        for variant, ratio in t["ratio"].items():
            rows.append(f"| {name} | {t['times']['jax.jit'] * 1e6:.0f} us | {variant} | "
                        f"{t['times'][variant] * 1e6:.0f} us | {ratio:.3f} |")
    return rows


def section15(r: dict) -> list[str]:
    rows = [f"## Case 15: TFC's PDE step per call after the fold ({r['n']}^3 points, {r['m']} functions, 64-bit)", "",
            "Each variant in a fresh process: the hand-folded `M @ xi + c` under `jax.jit` compiled first, then the "
            f"variant folds; its first {FIRST_CALLS_AFTER_FOLD} calls alternate one by one with the hand-folded "
            "program's (each waited for), then paired rounds of 200 calls.", ""]
    if "error" in r:
        return rows + [f"n/a: {r['error']}"]
    rows += ["| variant | fold | first calls | / hand | steady | / hand |", "|---|---|---|---|---|---|"]
    for name, t in r["variants"].items():
        if not t or "first" not in t:
            rows.append(f"| {name} | n/a | | | | |")
            continue
        f, s = t["first"], t["steady"]
        rows.append(f"| {name} | {t['fold_seconds']:.2f} s | {f['pejit'] * 1e6:.1f} us | {f['ratio']:.3f} | "
                    f"{s['pejit'] * 1e6:.1f} us | {s['ratio']:.3f} |")
    return rows
