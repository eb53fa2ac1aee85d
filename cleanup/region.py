"""Deprecated old name of ``cleanup.core.region``, kept for one release.

It is the same module object under both names, so that what is set on one is seen through the other.
"""

import sys
import warnings

from cleanup.core import region as _module
from cleanup.core.region import *  # noqa: F403 - the names, for type checkers

warnings.warn("cleanup.region is deprecated: import cleanup.core.region", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
