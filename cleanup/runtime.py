"""What one process shares across batches: settings, clients, metrics, the thread pool, and bucket, queue and table
facts."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from cleanup.actions.batch_calls import BatchCalls
from cleanup.actions.loading import BUILT_IN, instances, load_kinds
from cleanup.aws import permits
from cleanup.aws.answers import missing, needed
from cleanup.aws.calls import call
from cleanup.aws.clients import Clients, Reach
from cleanup.aws.coalesce import Batchmates
from cleanup.core.action_api import ActionKind, ClientSender, ReadOnlyClients
from cleanup.deadline import Deadline
from cleanup.exceptions import ConfigurationError
from cleanup.killswitch import KillSwitch, Mode, settings_for
from cleanup.telemetry import Metrics, MetricsSink, configure_logging, log
from schemas.session import SessionShape
from schemas.settings import CleanupMode, Settings, Versioning, configuration_problems

T = TypeVar("T")

# SQS's bounds of a queue's MaximumMessageSize, in bytes.
SQS_MESSAGE_BYTES = (1_024, 1_048_576)


class AskedOnce(Generic[T]):
    """Answers that do not change while the process lives (a bucket's versioning, a table's keys), asked once per
    key: however many threads want one at once, one of them asks and the others wait for its answer. A failed ask
    keeps nothing, so the next caller asks again."""

    def __init__(self) -> None:
        self._known: dict[str, T] = {}
        self._lock = threading.Lock()

    def get(self, key: str, ask: Callable[[], T]) -> T:
        known = self._known.get(key)
        if known is None:
            with self._lock:
                known = self._known.get(key)
                if known is None:
                    known = self._known[key] = ask()
        return known


def shape_of(kinds: Sequence[type[ActionKind]], settings: Settings) -> SessionShape:
    """What ``kinds`` read of an item: the attributes that name their resources (through ``ATTR_*``) and their own."""
    names = settings.attributes
    extra = tuple(dict.fromkeys(attribute for kind in kinds for attribute in kind.attributes))
    named = (getattr(names, field) for kind in kinds for field in kind.naming())
    return SessionShape(resources=tuple(dict.fromkeys([*named, *extra])), extra=extra)


class Runtime:
    """Built once per process by the entry point and passed down explicitly."""

    @classmethod
    def from_env(
        cls, *, environ: Mapping[str, str] | None = None, reach: Reach | None = None, **overrides: Any
    ) -> Runtime:
        """The entry point's runtime: settings read from the environment (or ``environ`` in its place), then
        ``overrides``; logging set up; clients that reach AWS as ``reach`` says (None: as botocore's configuration
        does).

        Raises:
            pydantic.ValidationError: a setting in the environment is invalid.
        """
        settings = Settings.from_env(environ)
        if overrides:
            settings = settings.model_copy(update=overrides)
        configure_logging(settings)
        return cls(settings, Clients(settings, reach=reach) if reach is not None else None)

    @classmethod
    def for_lambda(cls) -> Runtime:
        """``from_env`` for a Lambda handler: invalid settings fail the invocation with one clear line.

        The line is a JSON log record on the handler's log stream (level ERROR, ``variables`` naming each bad
        environment variable and why), and the error raised carries the same single line, not pydantic's dump.

        Raises:
            ConfigurationError: a setting in the environment is invalid, or ACTIONS enables a kind that is refused.
        """
        try:
            return cls.from_env()
        except ValidationError as exc:
            error = configuration_error(exc)
        except ConfigurationError as exc:  # ACTIONS names a kind that is unknown or refused
            error = exc
        configure_logging(Settings.model_construct())  # the defaults: the environment's settings are what failed
        log.error(str(error), extra={"variables": error.problems})
        raise error

    def __init__(
        self,
        settings: Settings,
        clients: Clients | None = None,
        metrics: Metrics | None = None,
        *,
        kinds: Sequence[type[ActionKind]] | None = None,
    ) -> None:
        """``kinds``: the action kinds to run, in order (None: ACTIONS's, checked now).

        Raises:
            ConfigurationError: ACTIONS names a kind that is unknown or refused (one line).
        """
        self.kind_classes = tuple(kinds) if kinds is not None else load_kinds(",".join(settings.actions))
        self._kinds: tuple[Settings, tuple[ActionKind, ...]] | None = None
        instances(self.kind_classes, settings)  # their attributes, as ATTR_* spells them, checked now
        self.settings = settings
        self.shape = shape_of(self.kind_classes, settings)
        self.clients = clients or Clients(settings)
        declared = {operation for kind in self.kind_classes for operation in kind.frees}
        self.clients.pacer.check.declared.update(declared)
        self.sender = ClientSender(self.clients)
        if any(BUILT_IN.get(kind.name) is not kind for kind in self.kind_classes):  # a kind's own boto3 clients too
            max_age = settings.fence_read_max_age_seconds
            permits.check_default_session(permits.SendCheck(max_age, declared, strict=True))
        self.metrics = metrics or Metrics(settings, MetricsSink(settings.metrics_destination))
        self._lock = threading.Lock()
        self._versioned: AskedOnce[bool] = AskedOnce()
        self._message_limits: AskedOnce[int] = AskedOnce()
        self._table_keys: AskedOnce[tuple[str, ...]] = AskedOnce()
        self._executor: ThreadPoolExecutor | None = None
        self._side: ThreadPoolExecutor | None = None
        self._plugins: ThreadPoolExecutor | None = None
        self._for_tables: dict[str, Runtime] = {}
        self.switch = KillSwitch(settings, self.metrics)

    @property
    def kinds(self) -> tuple[ActionKind, ...]:
        """The action kinds, in ACTIONS's order, made for the current settings."""
        made = self._kinds
        if made is None or made[0] is not self.settings:
            made = self._kinds = (self.settings, instances(self.kind_classes, self.settings))
        return made[1]

    def with_session_table(self, table: str) -> Runtime:
        """This runtime, or one like it (same clients and metrics) whose SESSION_TABLE is ``table`` when the
        environment left it unset; kept for the next call.

        Only an entry point whose source of records names its table trustworthily uses it: the Lambda handler (the
        event source mapping's stream) and the stream poller (the stream on its command line).
        """
        if self.settings.session_table is not None:
            return self
        with self._lock:
            runtime = self._for_tables.get(table)
            if runtime is None:
                # From the environment's mode, not one the kill switch put in force here: the new runtime has a
                # switch of its own.
                environment = CleanupMode(self.switch.environment.value)
                settings = self.settings.model_copy(update={"session_table": table, "cleanup_mode": environment})
                runtime = self._for_tables[table] = Runtime(
                    settings, self.clients, self.metrics, kinds=self.kind_classes
                )
            return runtime

    def refresh_mode(self) -> Mode:
        """Read the kill switch (between batches) and put its mode in force: ``settings.cleanup_mode`` follows it.

        Returns:
            The mode in force; ``Mode.PAUSED`` asks the caller to leave its records where they are.
        """
        mode = self.switch.mode()
        self.settings = settings_for(self.settings, mode)
        return mode

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The I/O pool records are cleaned on (kept warm across Lambda invocations)."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.settings.max_concurrency, thread_name_prefix="cleanup")
            return self._executor

    @property
    def side_executor(self) -> ThreadPoolExecutor:
        """The pool a record's calls issued together run on beside its own thread (``cleanup.core.fence``: a socket and
        a grant freed with the scratch data's first page, on one read). Apart from ``executor``, whose threads wait
        for them."""
        with self._lock:
            if self._side is None:
                self._side = ThreadPoolExecutor(2 * self.settings.max_concurrency, thread_name_prefix="cleanup-side")
            return self._side

    @property
    def plugin_executor(self) -> ThreadPoolExecutor:
        """The pool the steps of kinds that are not built in run on, so that a step still running at its bound is
        reported instead of waited for (``cleanup.core.plan``); never waited for on ``close``."""
        with self._lock:
            if self._plugins is None:
                self._plugins = ThreadPoolExecutor(self.settings.max_concurrency, thread_name_prefix="cleanup-kind")
            return self._plugins

    def built_in(self, kind: ActionKind) -> bool:
        """Whether ``kind`` is one the worker ships (it gets this runtime; any other gets ``plugin_host``)."""
        return BUILT_IN.get(kind.name) is type(kind)

    def batch_calls(self, mates: Batchmates | None = None) -> BatchCalls:
        """The shared requests of one batch whose worker threads are ``mates`` (None: one record's)."""
        return BatchCalls(self, mates)

    @property
    def plugin_host(self) -> PluginHost:
        """This runtime as a kind that is not built in may use it: read-only clients."""
        return PluginHost(self)

    def is_versioned(self, bucket: str, deadline: Deadline | None = None) -> bool:
        """Whether ``bucket`` can hold versions; asked once per process unless SCRATCH_VERSIONING says."""
        mode = self.settings.scratch_versioning
        if mode is not Versioning.AUTO:
            return mode is Versioning.ENABLED

        def ask() -> bool:
            answer = call(self.clients.s3.get_bucket_versioning, "GetBucketVersioning", deadline, Bucket=bucket)
            return answer.get("Status") in ("Enabled", "Suspended")

        return self._versioned.get(bucket, ask)

    def table_keys(self, table: str, deadline: Deadline | None = None) -> tuple[str, ...]:
        """``table``'s key attributes (partition key, then sort key): asked once per process (DescribeTable).

        Raises:
            TransientError / PermanentError: the table could not be described, or its answer names no key schema
                (nothing is cached then).
        """

        def ask() -> tuple[str, ...]:
            described = call(self.clients.dynamodb.describe_table, "DescribeTable", deadline, TableName=table)
            schema = needed(described, "DescribeTable", "Table", "KeySchema", kind=list)
            keys = {
                needed(key, "DescribeTable", "KeyType"): needed(key, "DescribeTable", "AttributeName", kind=str)
                for key in schema
            }
            if "HASH" not in keys:
                raise missing("DescribeTable", ("Table", "KeySchema", "HASH"))
            return tuple(str(keys[kind]) for kind in ("HASH", "RANGE") if kind in keys)

        return self._table_keys.get(table, ask)

    def message_limit(self, queue_url: str, deadline: Deadline | None = None) -> int:
        """The largest message ``queue_url`` accepts, in bytes: its MaximumMessageSize, asked once per process.

        Raises:
            TransientError / PermanentError: the attribute could not be read (nothing is cached then).
        """
        return self._message_limits.get(queue_url, lambda: self._ask_message_limit(queue_url, deadline))

    def _ask_message_limit(self, queue_url: str, deadline: Deadline | None) -> int:
        sqs = self.clients.sqs
        answer = call(
            sqs.get_queue_attributes,
            "GetQueueAttributes",
            deadline,
            QueueUrl=queue_url,
            AttributeNames=["MaximumMessageSize"],
        )
        low, high = SQS_MESSAGE_BYTES
        size = str(answer.get("Attributes", {}).get("MaximumMessageSize", ""))
        return min(max(int(size), low), high) if size.isdigit() else low

    def close(self) -> None:
        """Wait for the records still being cleaned, then stop the pools. The lock is not held while waiting: a record
        still running takes ``side_executor`` (under the lock) for its grant's name check, and would wait for ever."""
        with self._lock:
            records, self._executor = self._executor, None
            derived, self._for_tables = list(self._for_tables.values()), {}
        if records is not None:
            records.shutdown(wait=True)
        with self._lock:  # nothing submits to it now: the records that did are done
            side, self._side = self._side, None
            plugins, self._plugins = self._plugins, None
        if side is not None:
            side.shutdown(wait=True)
        if plugins is not None:  # a kind's step still running past its bound was reported: it is not waited for
            plugins.shutdown(wait=False, cancel_futures=True)
        for runtime in derived:
            runtime.close()


class PluginHost:
    """What a kind that is not built in gets of the runtime (``cleanup.core.action_api.Host``): the same settings, pools
    and table facts, and clients that only read; it frees through its gates (``Gate.aws``)."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self.clients = ReadOnlyClients(runtime.clients)

    @property
    def settings(self) -> Settings:
        return self._runtime.settings

    @property
    def side_executor(self) -> ThreadPoolExecutor:
        return self._runtime.side_executor

    def is_versioned(self, bucket: str, deadline: Deadline | None = None) -> bool:
        return self._runtime.is_versioned(bucket, deadline)

    def table_keys(self, table: str, deadline: Deadline | None = None) -> tuple[str, ...]:
        return self._runtime.table_keys(table, deadline)


class WarmRuntime:
    """A Lambda handler's runtime: built from the environment on the first invocation and kept while warm.

    Invalid settings fail the invocation with one ERROR line naming them (``Runtime.for_lambda``); nothing is kept,
    so the next invocation reads the environment again. ``use`` hands a handler another runtime for a while (tests,
    benchmarks, an application embedding the handler).
    """

    def __init__(self) -> None:
        self._runtime: Runtime | None = None

    @property
    def ready(self) -> bool:
        """Whether a runtime is kept (built, or handed in with ``use``)."""
        return self._runtime is not None

    def get(self) -> Runtime:
        if self._runtime is None:
            self._runtime = Runtime.for_lambda()
        return self._runtime

    @contextmanager
    def use(self, runtime: Runtime) -> Iterator[Runtime]:
        """Within the block the handler runs on ``runtime``; the warm one (if any) comes back after."""
        saved, self._runtime = self._runtime, runtime
        try:
            yield runtime
        finally:
            self._runtime = saved

    def forget(self) -> None:
        """Close and drop the warm runtime: the next invocation reads the environment again."""
        if self._runtime is not None:
            self._runtime.close()
        self._runtime = None


def require_session_table(settings: Settings) -> str:
    """SESSION_TABLE, which a command cleaning records from files or messages (replay, redrive) must have: such a
    record may name any table, and only SESSION_TABLE's items are sessions.

    Raises:
        ConfigurationError: SESSION_TABLE is not set.
    """
    if settings.session_table is None:
        raise ConfigurationError(
            {"SESSION_TABLE": "not set; records from files or messages are trusted only as items of this table"}
        )
    return settings.session_table


def configuration_error(exc: ValidationError) -> ConfigurationError:
    """The settings' validation error as one line naming each bad environment variable and why."""
    return ConfigurationError(configuration_problems(exc))
