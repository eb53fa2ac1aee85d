"""The scenarios' world: a stack and the gateway behind fault proxies."""

from tests.scenarios.helpers import world

__all__ = ["world"]
