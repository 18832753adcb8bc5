"""Every script in examples/ and ``python -m pejit demo`` run, at small sizes.

Each script checks its own results (against jax.jit, NumPy or a closed-form
solution) and exits non-zero when one is wrong.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ._util import requires_jax

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "seed000_basis.py": ([], ["f_pejit(xi) = [1. 0. 3.]", "residual 1 equation"]),
    "custom_primitive.py": ([], ["f_pejit(xi)   = [ 31. 175. 529.]", "MLIR translation rule"]),
    "linear_solve.py": (["--n", "40", "--repeat", "2"], ["relative residual", "triangular_solve"]),
    "tfc_ode.py": (["--points", "16", "--degree", "6", "--repeat", "2"], ["max error", "per solve"]),
    "pln_fit.py": (["--n", "30", "--p", "3", "--steps", "4"], ["pejit and jax.jit agree", "one ELBO evaluation"]),
    "multihost.py": (["--rows", "256"], ["process 1: holds 50% of A", "both processes agree"]),
    "export_folded.py": (["--n", "64", "--repeat", "2"], ["no custom call", "the deployed process agrees"]),
}


def run(args: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_every_example_is_tested():
    assert sorted(p.name for p in (ROOT / "examples").glob("*.py")) == sorted(CASES)


@requires_jax((0, 9), "the example scripts turn off jaxlib's YNN fusion (JAX issue #39103), a flag older jaxlibs abort on")
@pytest.mark.parametrize("script", sorted(CASES))
def test_example(script):
    args, expected = CASES[script]
    out = run([str(ROOT / "examples" / script), *args])
    for text in expected:
        assert text in out


def test_demo():
    out = run(["-m", "pejit", "demo", "--n", "64", "--repeat", "2"])
    assert "[ 31. 175. 529.]" in out
    assert "NotImplementedError: MLIR translation rule for primitive 'H'" in out
    assert "speedup:" in out and "estimated FLOPs" in out
