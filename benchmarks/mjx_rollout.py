"""MJX rollouts under pejit and ``jax.jit`` (issue 65): first call and per call.

The issue's program, as written: ``rollout = lambda mx, dx: jax.lax.fori_loop(0, 50,
lambda i, d: mjx.step(mx, d), dx).qpos`` with the model constant, on the issue's
small model (50 steps) and on ``humanoid.xml`` from ``mujoco-mjx``'s test data (20
steps). Per model:

* the first call (trace, fold, compile, run) of pejit, of ``jax.jit`` with the model
  as an argument and with it closed over, each in a fresh process (``--repeat``
  processes each, alternating);
* per call, the three side by side in one process, in rounds whose order
  alternates; ratios are medians of per-round ratios to each ``jax.jit`` variant.
  Beside them, pejit on a copy of the model whose NumPy arrays are read-only
  (:data:`READ_ONLY`).

Values are checked equal to ``jax.jit``'s. Needs ``mujoco-mjx``: with JAX 0.10.2,
``pip install "mujoco-mjx==3.17.0" "mujoco==3.17.0"`` (unpinned, pip may pair an older
mjx with mujoco 4's split packages, which fails to import). Run:
``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= python benchmarks/mjx_rollout.py [--repeat N]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

_YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="  # JAX issue #39103; children inherit it
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_YNN_OFF}".strip()

SMALL = """<mujoco><option timestep="0.005"/><worldbody><light pos="0 0 3"/><geom type="plane" size="5 5 .1"/>
<body pos="0 0 1"><joint type="free"/><geom type="box" size=".1 .2 .3" mass="1"/></body>
<body pos="0.5 0 1.5"><joint type="hinge" axis="0 1 0"/><geom type="capsule" fromto="0 0 0 0 0 -0.5" size="0.05"/>
<body pos="0 0 -0.5"><joint type="hinge" axis="0 1 0"/><geom type="capsule" fromto="0 0 0 0 0 -0.5" size="0.05"/></body></body>
</worldbody></mujoco>"""
STEPS = {"small": 50, "humanoid": 20}
VARIANTS = ("pejit", "jax.jit (model as argument)", "jax.jit (model closed over)")


def setup(model: str):
    """``(rollout, mx, dx)`` for ``model``."""
    import jax
    import mujoco
    from mujoco import mjx

    if model == "small":
        m = mujoco.MjModel.from_xml_string(SMALL)
    else:
        m = mujoco.MjModel.from_xml_path(os.path.join(os.path.dirname(mjx.__file__), "test_data/humanoid/humanoid.xml"))
    mx = mjx.put_model(m)
    dx = mjx.make_data(mx)
    steps = STEPS[model]
    rollout = lambda mx, dx: jax.lax.fori_loop(0, steps, lambda i, d: mjx.step(mx, d), dx).qpos  # noqa: E731
    return rollout, mx, dx


def calls(rollout, mx, dx, f=None) -> dict:
    """The three variants of a rollout (what :func:`setup` returns), each a zero-argument call;
    ``f``: the pejit function of ``rollout`` (a new one by default)."""
    import jax

    from pejit import pejit

    f = pejit(rollout, constant_argnums=0) if f is None else f
    jitted = jax.jit(rollout)
    closed = jax.jit(lambda dx: rollout(mx, dx))
    return dict(zip(VARIANTS, (lambda: f(mx, dx), lambda: jitted(mx, dx), lambda: closed(dx))))


#: Per call only, beside the issue's program: pejit on a model whose NumPy arrays
#: are read-only, as pejit's ``WritableConstantWarning`` advises (the humanoid's
#: 1 MiB texture array). pejit then recognizes them by identity, not by their bytes.
READ_ONLY = "pejit, the model's NumPy arrays read-only"


def read_only(tree):
    """A copy of an MJX model (nested frozen dataclasses) with its NumPy arrays read-only."""
    import copy
    import dataclasses

    import numpy as np

    tree = copy.deepcopy(tree)
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, np.ndarray):
            node.setflags(write=False)
        elif dataclasses.is_dataclass(node):
            stack.extend(getattr(node, f.name) for f in dataclasses.fields(node))
        elif isinstance(node, (tuple, list)):
            stack.extend(node)
    return tree


def first_call(model: str, variant: str) -> None:
    """In a fresh process: print the first call's seconds as JSON."""
    import jax

    fn = calls(*setup(model))[variant]
    start = time.perf_counter()
    jax.block_until_ready(fn())
    print(json.dumps({"seconds": time.perf_counter() - start}))


def per_call(model: str, rounds: int) -> dict:
    import numpy as np

    from pejit import pejit
    from pejit.bench._common import paired

    rollout, mx, dx = setup(model)
    f, g, frozen = pejit(rollout, constant_argnums=0), pejit(rollout, constant_argnums=0), read_only(mx)
    fns = calls(rollout, mx, dx, f)
    fns[READ_ONLY] = lambda: g(frozen, dx)
    outs = {k: np.asarray(fn()) for k, fn in fns.items()}
    # per call is what serves from then on (the staged API waits for work beside the first calls)
    f.specialize(mx, dx), g.specialize(frozen, dx)
    # a program compiled with the model in it rounds apart (XLA folds it: closed over too)
    for k, v in outs.items():
        np.testing.assert_allclose(v, outs[VARIANTS[1]], rtol=1e-5, atol=1e-6, err_msg=f"{k} differs from jax.jit")
    r = paired(fns, VARIANTS[1], calls=10, pairs=rounds, also=VARIANTS[2:])
    return {"us": {k: t * 1e6 for k, t in r["times"].items()},
            "max_abs_difference": {k: float(np.max(np.abs(v - outs[VARIANTS[1]]))) for k, v in outs.items()},
            "ratio": {v: {VARIANTS[1]: r["ratio"][v]} | {ref: r["ratio_to"][ref][v] for ref in VARIANTS[2:]}
                      for v in (VARIANTS[0], READ_ONLY)}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2, help="fresh processes per first-call sample (0: none)")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--first-call", nargs=2, help=argparse.SUPPRESS)  # a child process's job
    args = parser.parse_args(argv)
    if args.first_call:
        first_call(*args.first_call)
        return 0
    for model in STEPS:
        firsts = {v: [] for v in VARIANTS}
        for r in range(args.repeat):
            for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                out = subprocess.run([sys.executable, __file__, "--first-call", model, v], check=True,
                                     capture_output=True, text=True).stdout
                firsts[v].append(json.loads(out.splitlines()[-1])["seconds"])
        r = per_call(model, args.rounds)
        print(f"## {model} ({STEPS[model]} steps)")
        for v in VARIANTS:
            print(f"- {v}: first call {', '.join(f'{s:.1f}' for s in firsts[v])} s; per call {r['us'][v]:.0f} us")
        print(f"- {READ_ONLY}: per call {r['us'][READ_ONLY]:.0f} us")
        if args.repeat:  # (--repeat 0: per call only)
            best_jit_first = min(min(firsts[v]) for v in VARIANTS[1:])
            print(f"- pejit first call / jax.jit's (best of each): {min(firsts[VARIANTS[0]]) / best_jit_first:.2f}")
        print("- largest difference from jax.jit (model as argument): "
              + ", ".join(f"{k} {d:.1e}" for k, d in r["max_abs_difference"].items()))
        for v, ratios in r["ratio"].items():
            print(f"- {v}, per call / " + "; / ".join(f"{ref}: {x:.3f}" for ref, x in ratios.items())
                  + " (median of ratios paired by round)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
