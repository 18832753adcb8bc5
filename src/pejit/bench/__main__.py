"""Run the benchmark suite: ``python -m pejit.bench [--quick] [--out DIR]``.

Writes ``RESULTS-quick.md`` (or, without ``--quick``, ``RESULTS-full.md``)
and PNG plots (when matplotlib is installed) to ``--out`` (default
``benchmarks/``, which keeps the latest of each) and prints PASS/FAIL per
target. TFC's
``pejit`` runs in a separate Python (``--tfc-python`` or the
``PEJIT_BENCH_TFC_PYTHON`` environment variable; by default this Python if
it can import ``tfc``); without one, TFC's figures read "n/a".
"""

from __future__ import annotations

from ._common import set_xla_flags

set_xla_flags()  # before jax starts

import argparse  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

from . import cases, report, targets  # noqa: E402


def find_tfc_python(option: str | None) -> str | None:
    """A Python that can import ``tfc``, or ``None``."""
    candidates = [option, os.environ.get("PEJIT_BENCH_TFC_PYTHON"), sys.executable]
    for python in candidates:
        if not python:
            continue
        if os.sep in python:  # a path given relative to where the user is (the check runs in /)
            python = os.path.abspath(python)
        ok = subprocess.run([python, "-c", "import tfc"], capture_output=True, cwd="/").returncode == 0
        if ok:
            return python
        if python != sys.executable:
            print(f"warning: {python} cannot import tfc; TFC figures will be n/a", file=sys.stderr)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pejit.bench", description=__doc__.splitlines()[0].replace("``", ""))
    parser.add_argument("--quick", action="store_true", help="smaller problems, fewer repeats (< 3 minutes)")
    parser.add_argument("--out", default="benchmarks", help="directory for the results and plots")
    parser.add_argument("--name", default=None,
                        help="file name of the results (default: RESULTS-quick.md, or RESULTS-full.md)")
    parser.add_argument("--tfc-python", default=None, help="a Python with tfc installed")
    parser.add_argument("--cases", default="1,2,3,4,5,6,7,8,9,11,12,13,14,15,16",
                        help="comma-separated case numbers (10, the persistent cache, runs many fresh processes: ask for it)")
    parser.add_argument("--cold-repeat", type=int, default=None,
                        help="fresh processes per fold-time sample (default: 1 quick, 3 full)")
    parser.add_argument("--pde-sizes", default=None,
                        help="case 9's full-mode sizes, comma-separated: full, wave2d_full, large,"
                             " wave2d_large (default: all; TFC at the large sizes needs about 16 GB)")
    args = parser.parse_args(argv)
    if args.name is None:
        args.name = "RESULTS-quick.md" if args.quick else "RESULTS-full.md"

    tfc_python = find_tfc_python(args.tfc_python)
    selected = {int(c) for c in args.cases.split(",")}
    ctx = cases.Context(quick=args.quick, tfc_python=tfc_python, cold_repeat=args.cold_repeat,
                        pde_sizes=None if args.pde_sizes is None else tuple(args.pde_sizes.split(",")))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results, errors = {}, {}
    for number, run in cases.CASES.items():
        if number in selected:
            if results or errors:  # results so far survive an interrupted run
                report.write(out, args.name, ctx, results, targets.targets(results), errors, plots=False)
            print(f"== case {number}: {run.__doc__.splitlines()[0]}", flush=True)
            try:
                results[number] = run(ctx)
            except Exception:  # report it, keep measuring the other cases
                errors[number] = traceback.format_exc()
                print(errors[number], file=sys.stderr, flush=True)
    checked = targets.targets(results)
    report.write(out, args.name, ctx, results, checked, errors)
    for t in checked:
        print(f"{'PASS' if t.passed else 'FAIL' if t.passed is not None else 'N/A '}  {t.name}: {t.detail}")
    print(f"wrote {out / args.name}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
