"""pejit: partial-evaluation JIT compilation for JAX.

Arguments marked constant are folded at specialization time; the compiled
program keeps only the work that depends on the dynamic arguments.
"""

from ._auto import AutoCacheInfo as AutoCacheInfo
from ._auto import AutoPejitted as AutoPejitted
from ._auto import AutoReport as AutoReport
from ._cache import DEFAULT_CACHE_SIZE as DEFAULT_CACHE_SIZE
from ._cache import CacheInfo as CacheInfo
from ._explain import explain as explain
from ._folding import FoldOptions as FoldOptions
from ._folding import register_fold_rule as register_fold_rule
from ._api import pe as pe
from ._api import pejit as pejit
from ._jit import FoldingSkippedWarning as FoldingSkippedWarning
from ._jit import Pejitted as Pejitted
from ._jit import PejitWarning as PejitWarning
from ._tfc import BoundPejitted as BoundPejitted
from ._report import FoldReport as FoldReport
from ._residual import Residual as Residual
from ._residual import specialize_jaxpr as specialize_jaxpr

__version__ = "0.1.0"

__all__ = [
    "AutoCacheInfo",
    "AutoPejitted",
    "AutoReport",
    "BoundPejitted",
    "CacheInfo",
    "DEFAULT_CACHE_SIZE",
    "FoldOptions",
    "FoldReport",
    "FoldingSkippedWarning",
    "PejitWarning",
    "Pejitted",
    "Residual",
    "explain",
    "pe",
    "pejit",
    "register_fold_rule",
    "specialize_jaxpr",
]
