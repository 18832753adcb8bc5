"""First call vs. re-specialization of a call-time pejit function.

For each case, prints the wall time of:

* ``first``: the first call (trace; for value-independent functions also the
  compilation of the folding program; compilation of the residual program);
* ``2nd value``: a call with a new constant of the same shape and dtype
  (value-independent: compiling the folding program, then one run of it;
  value-dependent: a new trace and eager fold, and a residual compile);
* ``later``: a third value (value-independent: one run of the compiled
  folding program);
* ``cached``: a call whose specialization is cached.

The MLP cases pass a pytree of weights (plus the activation function, a
static leaf) as the constant; ``jax.nn.relu`` is a ``custom_jvp`` function,
``jnp.tanh`` a primitive.

Run: ``python benchmarks/respecialize.py``
"""

import os

_YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="  # JAX issue #39103
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_YNN_OFF}".strip()

import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pejit import pejit  # noqa: E402


def timed(fn, *args):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def linalg(a, x):
    return jnp.linalg.inv(a) @ x + jnp.linalg.cholesky(a @ a.T) @ x


def linalg_branching(a, x):  # value-dependent: Python looks at the constant
    return linalg(a, x) if a[0, 0] > 0 else x


def many_ops(a, x):
    for i in range(1000):
        a = jnp.sin(a) * 1.0001 + i * 1e-6
    return a @ x


def wide_ops(a, x):
    for _ in range(50):
        a = jnp.cos(a) @ a * 1e-3
    return a @ x


def mlp(params, x):
    """A plain-JAX MLP, like ``eqx.nn.MLP(64, 64, 512, 4)``; ``params["act"]`` is static."""
    *hidden, (w, b) = params["layers"]
    for wi, bi in hidden:
        x = params["act"](wi @ x + bi)
    return w @ x + b


def mlp_params(seed, act, sizes=(64, 512, 512, 512, 512, 64)):
    rng = np.random.default_rng(seed)
    layers = [
        (jnp.asarray(rng.normal(size=(m, n)) / np.sqrt(n), jnp.float32), jnp.asarray(rng.normal(size=m), jnp.float32))
        for n, m in zip(sizes[:-1], sizes[1:])
    ]
    return {"layers": layers, "act": act}


@jax.custom_vjp
def softplus_dot(w, x):  # a custom_vjp whose operands include a folded constant
    return jnp.logaddexp(w @ x, 0.0)


def _softplus_dot_fwd(w, x):
    return softplus_dot(w, x), (w, x)


def _softplus_dot_bwd(res, g):
    w, x = res
    s = jax.nn.sigmoid(w @ x) * g
    return jnp.outer(s, x), w.T @ s


softplus_dot.defvjp(_softplus_dot_fwd, _softplus_dot_bwd)


def custom_vjp_case(a, x):
    return softplus_dot(jnp.linalg.inv(a), x)


def no_custom_rule_case(a, x):  # the same folding work, without a custom rule
    return jnp.tanh(jnp.linalg.inv(a) @ x)


def report(name, f, consts, x):
    first = timed(f, consts[0], x)
    second = timed(f, consts[1], x)
    later = min(timed(f, c, x) for c in consts[2:])
    cached = min(timed(f, consts[0], x) for _ in range(5))
    kind = "value-independent" if f.specialize(consts[0], x).program.folding_program is not None else "value-dependent"
    print(f"{name:<34}{kind:>18}{first:10.3f}{second:12.4f}{later:10.4f}{cached:10.5f}")


def mlp_case(name, act, values=6):
    consts = [mlp_params(seed, act) for seed in range(values)]
    report(name, pejit(mlp, constant_argnums=0), consts, jnp.ones(64, jnp.float32))


def case(name, fun, n):
    rng = np.random.default_rng(0)
    consts = [jnp.asarray(rng.normal(size=(n, n)) + n * np.eye(n), jnp.float32) for _ in range(4)]
    report(name, pejit(fun, constant_argnums=0), consts, jnp.ones(n, jnp.float32))


def main():
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; seconds")
    print(f"{'case':<34}{'':>18}{'first':>10}{'2nd value':>12}{'later':>10}{'cached':>10}")
    case("inv + cholesky, n=1000", linalg, 1000)
    case("inv + cholesky, n=1000, branching", linalg_branching, 1000)
    case("1000 elementwise ops, n=256", many_ops, 256)
    case("50 matmul ops, n=1024", wide_ops, 1024)
    mlp_case("MLP 64-512x4-64, tanh", jnp.tanh)
    mlp_case("MLP 64-512x4-64, relu", jax.nn.relu)
    case("custom_vjp of inv(a), n=256", custom_vjp_case, 256)
    case("tanh of inv(a), n=256", no_custom_rule_case, 256)


if __name__ == "__main__":
    main()
