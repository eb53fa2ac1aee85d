"""Deprecated old name of ``cleanup.queues.integrity_check``, kept for one release.

It is the same module object under both names, so that what is set on one is seen through the other.
"""

import sys
import warnings

from cleanup.queues import integrity_check as _module
from cleanup.queues.integrity_check import *  # noqa: F403 - the names, for type checkers

warnings.warn(
    "cleanup.integrity_check is deprecated: import cleanup.queues.integrity_check", DeprecationWarning, stacklevel=2
)
sys.modules[__name__] = _module
