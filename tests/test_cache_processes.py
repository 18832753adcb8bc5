"""Cache behaviour that needs a fresh process: memory growth, 8 CPU devices,
JAX's persistent compilation cache."""

import json
import os
import subprocess
import sys
import textwrap

import pytest


def run_child(code: str, *, env: dict | None = None, timeout: int = 300) -> dict:
    """Run ``code`` in a fresh Python; it prints one JSON object last.

    The child keeps this process's ``XLA_FLAGS`` (conftest.py's YNN
    workaround, where the jaxlib has it) before those of ``env``, which win
    where both set a flag (a device count of this process's own, say).
    """
    env = dict(env or {})
    full_env = dict(os.environ, **env)
    full_env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {env.get('XLA_FLAGS', '')}".strip()
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env=full_env, timeout=timeout,
    )
    if proc.returncode != 0:
        pytest.fail(f"child process failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_rss_stays_flat_when_constants_keep_changing():
    result = run_child("""
        import json, resource, gc
        import jax, jax.numpy as jnp
        from pejit import pejit

        def rss_mb():
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024

        f = pejit(lambda a, x: jnp.sin(a) @ x + jnp.cos(a).sum(), constant_argnums=0)
        x = jnp.ones(256)
        def call(i):
            a = jnp.full((256, 256), float(i))  # 256 KiB constant, dropped after the call
            jax.block_until_ready(f(a, x))
        for i in range(100):
            call(i)
        gc.collect()
        before = rss_mb()
        for i in range(2000):
            call(i)
        gc.collect()
        print(json.dumps({"growth_mb": rss_mb() - before, "info": f.cache_info()}))
    """)
    # Leaking the constants and their folded values would take ~1 GB; even
    # the default LRU bound alone would keep ~64 MB.
    assert result["growth_mb"] < 50, result
    hits, misses, maxsize, currsize = result["info"]
    assert misses == 2100 and currsize <= 1


#: The child computes on 8 CPU devices, whatever this process computes on.
EIGHT_CPUS = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}

_MESH_SETUP = """
    import json
    import numpy as np
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    from pejit import pejit

    assert jax.device_count() == 8
    mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    rows = NamedSharding(mesh, P("d"))
    replicated = NamedSharding(mesh, P())
    a_host = np.linspace(-1, 1, 1024 * 64, dtype=np.float32).reshape(1024, 64)
    x_host = np.linspace(0, 1, 64, dtype=np.float32)
    a = jax.device_put(a_host, rows)
    x = jax.device_put(x_host, replicated)

    def per_device_fraction(arr):
        return arr.addressable_shards[0].data.nbytes / arr.nbytes

    def all_gathers(compiled):
        return compiled.as_text().count("all-gather")
"""


def test_sharded_constant_stays_sharded_through_folding():
    result = run_child(_MESH_SETUP + """
    def f(a, x):
        return jnp.tanh(jnp.sin(a) * 2.0) * x  # elementwise folds, then a residual mul

    def g(a, x):  # value-dependent: folded eagerly, not by a compiled program
        return jnp.tanh(jnp.sin(a) * 2.0) * x if a.sum() > -1e9 else x

    out = {}
    for name, fun in (("compiled_fold", f), ("eager_fold", g)):
        pf = pejit(fun, constant_argnums=0)
        y = pf(a, x)
        spec = pf.specialize(a, x)
        (folded,) = spec.consts
        out[name] = {
            "fraction": per_device_fraction(folded),
            "error": float(np.abs(np.asarray(y) - np.tanh(np.sin(a_host) * 2.0) * x_host).max()),
            "gathers": all_gathers(pf.lower(a, x).compile()),
            "gathers_jit": all_gathers(jax.jit(f).lower(a, x).compile()),  # g is f, unjittable
            "out_fraction": per_device_fraction(y),
            "template": spec.program.folding_program is not None,
        }
    print(json.dumps(out))
    """, env=EIGHT_CPUS)
    assert result["compiled_fold"]["template"] and not result["eager_fold"]["template"]
    for r in result.values():
        assert r["fraction"] == pytest.approx(1 / 8)
        assert r["out_fraction"] == pytest.approx(1 / 8)
        assert r["gathers"] <= r["gathers_jit"]
        assert r["error"] < 1e-5


def test_shardings_refer_to_the_users_signature():
    result = run_child(_MESH_SETUP + """
    def f(x, a):
        return (jnp.linalg.inv(a[:64] + 64 * jnp.eye(64)) @ x) + jnp.sin(a).sum(0) * x

    reference = np.asarray(jax.jit(f)(x_host, a_host))
    pf = pejit(f, constant_argnums=1, in_shardings=(replicated, None), out_shardings=rows)
    y = pf(x, a)
    placed = pejit(f, constant_argnums=1, constant_shardings=replicated)
    z = placed(x, a)
    print(json.dumps({
        "error": float(np.abs(np.asarray(y) - reference).max()),
        "out_fraction": per_device_fraction(y),
        "placed_error": float(np.abs(np.asarray(z) - reference).max()),
        "placed_fractions": [per_device_fraction(c) for c in placed.specialize(x, a).consts],
    }))
    """, env=EIGHT_CPUS)
    assert result["error"] < 1e-4 and result["placed_error"] < 1e-4
    assert result["out_fraction"] == pytest.approx(1 / 8)
    assert result["placed_fractions"] and all(f == 1 for f in result["placed_fractions"])


def test_second_process_reuses_the_persistent_compilation_cache(tmp_path):
    code = """
        import json
        import jax, jax.numpy as jnp, numpy as np
        from jax import monitoring
        from pejit import pejit

        events = []
        monitoring.register_event_listener(lambda name, **kw: events.append(name))
        a = np.linspace(1, 2, 16, dtype=np.float32).reshape(4, 4) + 4 * np.eye(4, dtype=np.float32)
        f = pejit(lambda a, x: jnp.linalg.inv(a) @ x + jnp.sin(a).sum(), constant_argnums=0)
        y = f(a, np.ones(4, np.float32))
        f.specialize(a, np.ones(4, np.float32))  # the fold beside the call, its residual compiled
        print(json.dumps({
            "y": np.asarray(y).tolist(),
            "hits": events.count("/jax/compilation_cache/cache_hits"),
            "misses": events.count("/jax/compilation_cache/cache_misses"),
        }))
    """
    env = {  # pejit's own persistent cache off: the folding programs run, from JAX's cache
        "PEJIT_CACHE_DIR": "",
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
    }
    first = run_child(code, env=env)
    second = run_child(code, env=env)
    assert first["misses"] >= 2  # at least the folding and the residual programs
    assert second["misses"] == 0 and second["hits"] >= first["misses"]
    assert second["y"] == first["y"]
