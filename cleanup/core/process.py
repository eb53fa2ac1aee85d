"""What the core uses of the process it runs in, as narrow interfaces: the entry points' ``cleanup.runtime.Runtime``
is one; the core imports none of the layers above it.

* ``Configured``: the settings, the shape of a session item the enabled kinds read, and the clients (``classify``,
  ``region``);
* ``Calls``: the requests one batch's records share (``cleanup.actions.batch_calls.BatchCalls``: live items read
  together, scratch pages deleted together);
* ``Process``: what the pipeline and the plan run records with: the kinds, the pools, the metrics, and the batch's
  shared calls.
"""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any, Protocol

from cleanup.aws.clients import Clients
from cleanup.aws.coalesce import Batchmates
from cleanup.core.action_api import ActionKind, Host, Sender, Shared
from cleanup.core.fence import LiveRead
from cleanup.telemetry import Metrics
from schemas.session import SessionShape
from schemas.settings import Settings

__all__ = ["Calls", "Configured", "Process"]


class Configured(Protocol):
    """The settings in force, what the enabled kinds read of an item, and the process's clients."""

    @property
    def settings(self) -> Settings: ...
    @property
    def shape(self) -> SessionShape: ...
    @property
    def clients(self) -> Clients: ...


class Calls(Shared, Protocol):
    """The requests one batch's records share: the kinds' (``Shared``), the fences' readers of live items, and the
    batch's worker threads."""

    @property
    def mates(self) -> Batchmates: ...
    def reader(self, table: str, keys: dict[str, Any]) -> LiveRead: ...


class Process(Configured, Host, Protocol):
    """What the pipeline (``cleanup.core.pipeline``) and the plan (``cleanup.core.plan``) run records with; a kind
    that is built in plans with it too (``Host``)."""

    @property
    def metrics(self) -> Metrics: ...
    @property
    def kinds(self) -> tuple[ActionKind, ...]: ...
    @property
    def sender(self) -> Sender: ...
    @property
    def executor(self) -> Executor: ...
    @property
    def plugin_executor(self) -> Executor: ...
    @property
    def plugin_host(self) -> Host: ...
    def built_in(self, kind: ActionKind) -> bool:
        """Whether ``kind`` is one the worker ships (it gets the process itself; any other gets ``plugin_host``)."""
        ...

    def batch_calls(self, mates: Batchmates | None = None) -> Calls:
        """The shared requests of one batch whose worker threads are ``mates`` (None: one record's)."""
        ...
