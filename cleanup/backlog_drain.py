"""Deprecated old name of ``cleanup.queues.backlog_drain``, kept for one release.

It is the same module object under both names, so that what is set on one is seen through the other.
"""

import sys
import warnings

from cleanup.queues import backlog_drain as _module
from cleanup.queues.backlog_drain import *  # noqa: F403 - the names, for type checkers

warnings.warn(
    "cleanup.backlog_drain is deprecated: import cleanup.queues.backlog_drain", DeprecationWarning, stacklevel=2
)
sys.modules[__name__] = _module
