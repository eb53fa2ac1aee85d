"""Deprecated old name of ``cleanup.core.guard``, kept for one release.

It is the same module object under both names, so that what is set on one is seen through the other.
"""

import sys
import warnings

from cleanup.core import guard as _module
from cleanup.core.guard import *  # noqa: F403 - the names, for type checkers

warnings.warn("cleanup.guard is deprecated: import cleanup.core.guard", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
