"""Deprecated old name of ``cleanup.queues.deadletter``, kept for one release.

It is the same module object under both names, so that what is set on one is seen through the other.
"""

import sys
import warnings

from cleanup.queues import deadletter as _module
from cleanup.queues.deadletter import *  # noqa: F403 - the names, for type checkers

warnings.warn("cleanup.deadletter is deprecated: import cleanup.queues.deadletter", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
