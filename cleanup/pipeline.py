"""Deprecated old name of ``cleanup.core.pipeline``, kept for one release.

It is the same module object under both names, so that what is set on one is seen through the other.
"""

import sys
import warnings

from cleanup.core import pipeline as _module
from cleanup.core.pipeline import *  # noqa: F403 - the names, for type checkers

warnings.warn("cleanup.pipeline is deprecated: import cleanup.core.pipeline", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
