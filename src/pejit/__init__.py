"""pejit: partial-evaluation JIT compilation for JAX.

Arguments marked constant are folded at specialization time; the compiled
program keeps only the work that depends on the dynamic arguments.

The package, top to bottom (each part imports only the parts below it):

* the public surface, here: ``_api`` (``pejit``, ``pe``), ``_jit``
  (``Pejitted``), ``_tfc`` (``BoundPejitted``), ``_auto``
  (``AutoPejitted``), ``_explain``, ``_export``; ``__main__`` and
  ``_demo``, the command line;
* ``_calls``: the call path, from arguments to a cached specialization;
* ``_residual``: partial evaluation to a residual program, fold rules and
  the passes over the residual;
* ``_reports``: ``FoldReport`` and the estimates of ``auto``;
* ``_fold``: the folding trace and its back end;
* ``_compat``: every JAX internal pejit uses, and every difference between
  the JAX versions it supports.
"""

from ._api import pe as pe
from ._api import pejit as pejit
from ._auto import AutoCacheInfo as AutoCacheInfo
from ._auto import AutoPejitted as AutoPejitted
from ._auto import AutoReport as AutoReport
from ._calls._cache import DEFAULT_CACHE_BYTES as DEFAULT_CACHE_BYTES
from ._calls._cache import DEFAULT_CACHE_SIZE as DEFAULT_CACHE_SIZE
from ._calls._cache import CacheInfo as CacheInfo
from ._calls._errors import FoldingSkippedWarning as FoldingSkippedWarning
from ._calls._errors import NothingFoldedWarning as NothingFoldedWarning
from ._calls._errors import PejitWarning as PejitWarning
from ._calls._errors import RespecializingWarning as RespecializingWarning
from ._calls._errors import WritableConstantWarning as WritableConstantWarning
from ._calls._persist import PersistentCacheWarning as PersistentCacheWarning
from ._calls._program import Specialization as Specialization
from ._calls._stages import Compiled as Compiled
from ._calls._stages import Lowered as Lowered
from ._calls._stages import Traced as Traced
from ._explain import explain as explain
from ._export import export_folded as export_folded
from ._fold._options import FoldOptions as FoldOptions
from ._jit import Pejitted as Pejitted
from ._reports._report import FoldReport as FoldReport
from ._residual._partial_eval import Residual as Residual
from ._residual._partial_eval import specialize_jaxpr as specialize_jaxpr
from ._residual.rules.registry import register_fold_rule as register_fold_rule
from ._tfc import BoundPejitted as BoundPejitted

__version__ = "0.1.0"

__all__ = [
    "AutoCacheInfo",
    "AutoPejitted",
    "AutoReport",
    "BoundPejitted",
    "CacheInfo",
    "Compiled",
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_CACHE_SIZE",
    "FoldOptions",
    "FoldReport",
    "FoldingSkippedWarning",
    "Lowered",
    "NothingFoldedWarning",
    "PejitWarning",
    "Pejitted",
    "PersistentCacheWarning",
    "Residual",
    "RespecializingWarning",
    "Specialization",
    "Traced",
    "WritableConstantWarning",
    "explain",
    "export_folded",
    "pe",
    "pejit",
    "register_fold_rule",
    "specialize_jaxpr",
]
