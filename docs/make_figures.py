"""Regenerate the pictures of the docs: ``python docs/make_figures.py`` (needs Graphviz's ``dot``).

The DOT text comes from :meth:`pejit.FoldReport.to_dot`; both it and the PNG
are committed, so building the site needs neither JAX nor Graphviz.
"""

import os
import subprocess
from pathlib import Path

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_experimental_ynn_fusion_type="

import jax.numpy as jnp  # noqa: E402

from pejit import explain  # noqa: E402

IMG = Path(__file__).parent / "img"


def inv_chol(A, x):
    return jnp.linalg.inv(A) @ x + jnp.linalg.cholesky(A @ A.T) @ x


def main():
    report = explain(inv_chol, 3 * jnp.eye(4), jnp.ones(4), constant_argnums=0)
    dot = IMG / "inv_chol.dot"
    dot.write_text(report.to_dot("inv(A) @ x + cholesky(A @ A.T) @ x") + "\n")
    subprocess.run(["dot", "-Tpng", "-Gdpi=110", str(dot), "-o", str(IMG / "inv_chol.png")], check=True)
    # The fold time depends on the machine and its load: leave it out.
    lines = [line for line in str(report).splitlines() if not line.startswith("fold time")]
    (IMG / "inv_chol.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
