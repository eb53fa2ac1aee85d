"""Deprecated old name of ``cleanup.queues.integrity``, kept for one release.

It is the same module object under both names, so that what is set on one is seen through the other.
"""

import sys
import warnings

from cleanup.queues import integrity as _module
from cleanup.queues.integrity import *  # noqa: F403 - the names, for type checkers

warnings.warn("cleanup.integrity is deprecated: import cleanup.queues.integrity", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
