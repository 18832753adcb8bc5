"""Making a long fold visible: stage timings and a progress bar.

Every specialization logs its stages (trace, fold, each batch of known
work with its back end) to the ``pejit`` logger: at ``INFO`` the stages,
at ``DEBUG`` each batch. ``FoldOptions(progress=True)``, or the environment
variable ``PEJIT_PROGRESS=1``, also shows a progress bar of the equations
evaluated, when ``tqdm`` is installed (``pip install pejit[progress]``);
without it the same progress goes to the logger at ``INFO``, a line per
batch, since a bar nobody sees helps nobody.

To see the stages of every fold in a script::

    import logging
    logging.basicConfig()
    logging.getLogger("pejit").setLevel(logging.INFO)   # DEBUG: each batch too

which prints, for the call-time form, ``pejit step: trace 1.2 s`` then
``pejit step: fold 2.3 s`` (the folding program's first value), and for the
TFC form (and for constants whose values steer the trace)
``pejit step: trace and fold 3.1 s``.

Examples:
  >>> from pejit._fold._progress import wanted
  >>> wanted(True), wanted(False)
  (True, False)
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger("pejit")

#: The environment variable that turns the progress bar on for every fold.
ENV = "PEJIT_PROGRESS"


def wanted(progress: bool | None) -> bool:
    """Whether to show progress: ``FoldOptions.progress``, else ``$PEJIT_PROGRESS``."""
    if progress is not None:
        return progress
    return os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


class Progress:
    """The visible progress of one fold: a bar (or log lines) and stage timings.

    ``advance(n)`` counts evaluated equations; ``stage(what)`` times a stage
    and logs it. One is cheap when nobody watches: no bar, and log records
    are only formatted if the logger is enabled.
    """

    def __init__(self, name: str, show: bool):
        self.name = name
        self._bar: Any = None
        self._lines = False  # no tqdm: progress as log lines
        if show:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                self._lines = True
            else:
                self._bar = tqdm(desc=f"pejit {name}", unit="eqn", leave=False, dynamic_ncols=True)

    def expect(self, total: int) -> None:
        """The bar's total: ``total`` equations to evaluate."""
        if self._bar is not None:
            self._bar.reset(total=total)

    def advance(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def describe(self, what: str) -> None:
        if self._bar is not None:
            self._bar.set_description(f"pejit {self.name}: {what}", refresh=False)

    def log(self, level: int, msg: str, *args) -> None:
        """Log ``msg`` to the ``pejit`` logger (at ``INFO`` at least when showing progress without a bar)."""
        if self._lines:
            level = max(level, logging.INFO)
        if logger.isEnabledFor(level):
            logger.log(level, "pejit %s: " + msg, self.name, *args)
        elif self._lines:  # progress asked for, logging not configured: still say it
            print(f"pejit {self.name}: " + msg % args, file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def stage(self, what: str) -> Iterator[None]:
        """Time the stage ``what`` and log it at ``INFO``."""
        self.describe(what)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.log(logging.INFO, "%s %.3g s", what, time.perf_counter() - start)

    def batch(self, backends: dict, equations: int, out_bytes: int, kept_bytes: int, seconds: float) -> None:
        """Log one batch of known work at ``DEBUG``: what its equations wrote
        (``out_bytes``, the intermediates included) against what it kept."""
        how = ", ".join(f"{n} {b}" for b, n in sorted(backends.items()))
        self.log(logging.DEBUG, "batch of %d equations (segments: %s), %.1f MiB written, %.1f MiB kept, %.3g s",
                 equations, how, out_bytes / 2**20, kept_bytes / 2**20, seconds)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
