"""The old name of ``cleanup.application_contract``, kept for one release: deprecated, import
``cleanup.application_contract``.

It is the same module object under both names, so that what is set on one is seen through the other.
"""

import sys
import warnings

from cleanup import application_contract
from cleanup.application_contract import *  # noqa: F403 - the names, for type checkers

warnings.warn(
    "cleanup.expiry.write_path is deprecated: import cleanup.application_contract", DeprecationWarning, stacklevel=2
)
sys.modules[__name__] = application_contract
