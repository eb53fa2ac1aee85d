"""Deprecated old name of ``cleanup.core.retry_in_place``, kept for one release.

It is the same module object under both names, so that what is set on one is seen through the other.
"""

import sys
import warnings

from cleanup.core import retry_in_place
from cleanup.core.retry_in_place import *  # noqa: F403 - the names, for type checkers

warnings.warn("cleanup.inplace is deprecated: import cleanup.core.retry_in_place", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = retry_in_place
