"""Deprecated old name of ``cleanup.queues.record_image``, kept for one release.

It is the same module object under both names, so that what is set on one is seen through the other.
"""

import sys
import warnings

from cleanup.queues import record_image as _module
from cleanup.queues.record_image import *  # noqa: F403 - the names, for type checkers

warnings.warn(
    "cleanup.record_image is deprecated: import cleanup.queues.record_image", DeprecationWarning, stacklevel=2
)
sys.modules[__name__] = _module
