"""Deprecated old name of ``cleanup.core.classify``, kept for one release.

It is the same module object under both names, so that what is set on one is seen through the other.
"""

import sys
import warnings

from cleanup.core import classify as _module
from cleanup.core.classify import *  # noqa: F403 - the names, for type checkers

warnings.warn("cleanup.classify is deprecated: import cleanup.core.classify", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
