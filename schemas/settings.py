"""The worker's settings: one frozen object per process, read from the environment by the entry point.

Every environment variable the worker reads is declared here, and only here. AWS endpoints, region and credentials are
not settings of ours: boto3 reads ``AWS_ENDPOINT_URL``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` and the credential
chain itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from enum import StrEnum
from typing import Annotated, ClassVar
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

LOG_LEVELS = frozenset({"CRITICAL", "FATAL", "ERROR", "WARN", "WARNING", "INFO", "DEBUG", "NOTSET"})
METRICS_STREAMS = frozenset({"auto", "stdout", "stderr", "off"})
# Characters S3 keys and IAM resource ARNs take as they are: no IAM wildcard ('*', '?'), no space, no '%'.
_SAFE_PREFIX = re.compile(r"[A-Za-z0-9/!_.'()-]+")
# A KMS key's ARN: the one spelling of a key that can be compared as a string (RetireGrant takes no alias either).
KMS_KEY_ARN = re.compile(r"arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+")
# An AWS region's name (us-east-1, eu-central-2, us-gov-west-1, cn-north-1).
REGION_NAME = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]{1,2}")
# A session's grant is created before its item is written: reconcile must not take a session being created (grant,
# no item yet) for a gone one. A create takes seconds, a minute or two with retries; the floor is well above that.
RECONCILE_GRACE_FLOOR_SECONDS = 900
# An action kind's name, as ACTIONS lists it.
ACTION_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")

Names = Annotated[tuple[str, ...], NoDecode]
"""A comma-separated list in the environment (``a, b``), in its order; blanks around items and empty items dropped."""


_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("environ", default=None)
"""The environment variables the settings being made read instead of the process's (``Settings.from_env``)."""


class _Environ(EnvSettingsSource):
    """Environment variables from a mapping, read as pydantic-settings reads the process's."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        if self.case_sensitive:
            return dict(self._environ)
        return {name.lower(): value for name, value in self._environ.items()}


class _FromEnviron(BaseSettings):
    """Settings that read ``Settings.from_env``'s mapping, when one is given, in place of ``os.environ``."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        environ = _ENVIRON.get()
        env = env_settings if environ is None else _Environ(settings_cls, environ)
        return init_settings, env, dotenv_settings, file_secret_settings


@contextmanager
def _reading(environ: Mapping[str, str] | None) -> Iterator[None]:
    token = _ENVIRON.set(environ)
    try:
        yield
    finally:
        _ENVIRON.reset(token)


class CleanupMode(StrEnum):
    """``enforce`` carries out the plan; ``dry-run`` only logs it (for a first, watched deployment)."""

    ENFORCE = "enforce"
    DRY_RUN = "dry-run"


class Versioning(StrEnum):
    """How the scratch bucket's versioning is known: asked once per process (``auto``) or stated."""

    AUTO = "auto"
    ENABLED = "enabled"
    DISABLED = "disabled"


class StartPosition(StrEnum):
    TRIM_HORIZON = "TRIM_HORIZON"
    LATEST = "LATEST"


class Binding(StrEnum):
    """How a session's grant and scratch prefix must be bound to it before they are freed (SESSION_BINDING)."""

    OWN = "own"  # named for this session, or unnamed and made for this worker; kept when named for another
    STRICT = "strict"  # named for this session only, as the write path names them
    OFF = "off"  # whatever the item names (the guard's rules still hold)


_BINDING_ALIASES = {"true": Binding.STRICT, "false": Binding.OFF}
"""The earlier boolean values: ``true`` was the strict rule."""


class LogIdentifiers(StrEnum):
    """How log lines name a session's resources: as they are, or by a keyed hash (``cleanup.telemetry``)."""

    PLAIN = "plain"
    HASHED = "hashed"


class AttributeNames(_FromEnviron):
    """Names of the session item's attributes (defaults from the source design), and of the connection registry's
    connection id (``registry_connection_id``)."""

    model_config = SettingsConfigDict(frozen=True, env_prefix="ATTR_", extra="ignore")

    pk: str = "pk"
    """ATTR_PK: the session table's partition key."""
    sk: str = "sk"
    """ATTR_SK: the session table's sort key (if it has one)."""
    connection_id: str = "connectionId"
    """ATTR_CONNECTION_ID: the WebSocket connection id (or, with CONNECTION_ID_PATTERN, the value holding it)."""
    scratch_prefix: str = "scratchPrefix"
    """ATTR_SCRATCH_PREFIX: the session's S3 scratch prefix (a key prefix in SCRATCH_BUCKET, or an s3:// URI)."""
    grant_id: str = "grantId"
    """ATTR_GRANT_ID: the session's KMS grant id."""
    tenant_id: str = "tenantId"
    """ATTR_TENANT_ID: the session's tenant (logged; with SCRATCH_TENANT_SCOPED, the prefix must lie under it)."""
    ttl: str = "ttl"
    """ATTR_TTL: the expiry time (N, epoch seconds): the table's TTL attribute."""
    kms_key_id: str = "kmsKeyId"
    """ATTR_KMS_KEY_ID: the grant's key ARN, when it is not KMS_KEY_ID."""
    callback_url: str = "callbackUrl"
    """ATTR_CALLBACK_URL: the session's management endpoint, when it is not WS_CALLBACK_URL."""
    expiry_bucket: str = "expiryBucket"
    """ATTR_EXPIRY_BUCKET: the sweeper's index partition key (the ttl rounded down to EXPIRY_BUCKET_SECONDS)."""
    home_region: str | None = None
    """ATTR_HOME_REGION: with GLOBAL_TABLE, an attribute where the application declares the region a session lives
    in (e.g. ``homeRegion``); unset: the region is told by the item's resources alone."""
    registry_connection_id: str = "connectionId"
    """ATTR_REGISTRY_CONNECTION_ID: the registry items' connection id, the key of REGISTRY_CONNECTION_INDEX."""
    registry_session_id: str = "sessionId"
    """ATTR_REGISTRY_SESSION_ID: the registry items' session id (``join_room`` writes it): how reconcile finds a
    membership's session; a membership without one is never freed by reconcile."""
    registry_joined_at: str = "joinedAt"
    """ATTR_REGISTRY_JOINED_AT: when the membership was written (N, epoch seconds); reconcile keeps memberships
    younger than RECONCILE_GRACE_SECONDS, or without it."""

    @property
    def session(self) -> tuple[str, ...]:
        """The attributes a session is built from (``schemas.session.Session``): the only ones decoded of an item."""
        return (
            self.pk,
            self.sk,
            self.connection_id,
            self.scratch_prefix,
            self.grant_id,
            self.tenant_id,
            self.ttl,
            self.kms_key_id,
            self.callback_url,
        )

    @property
    def resources(self) -> tuple[str, ...]:
        """Attributes that hold something to clean; an image with none of them is not a session."""
        return (self.connection_id, self.scratch_prefix, self.grant_id)


class Settings(_FromEnviron):
    """Everything the worker is configured with. Field docs give the environment variable in capitals."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    refuse_dead_letter_overlap: ClassVar[bool] = True
    """A dead-letter prefix overlapping the scratch root is a validation error (the preflight reports it instead)."""

    # What to clean.
    scratch_bucket: str | None = None
    """SCRATCH_BUCKET: the bucket holding session scratch prefixes; an s3:// prefix naming another is refused."""
    scratch_root: str = "sessions/"
    """SCRATCH_ROOT: every deletable prefix lies strictly under this one."""
    scratch_tenant_scoped: bool = False
    """SCRATCH_TENANT_SCOPED: also require the prefix to lie under ``<root><tenantId>/``."""
    scratch_versioning: Versioning = Versioning.AUTO
    """SCRATCH_VERSIONING: ``auto`` asks GetBucketVersioning once per process."""
    ws_callback_url: str | None = None
    """WS_CALLBACK_URL: API Gateway management endpoint, used when the item has no callbackUrl."""
    allowed_callback_urls: Names = ()
    """ALLOWED_CALLBACK_URLS: comma-separated endpoints an item's callbackUrl may name besides WS_CALLBACK_URL (another
    ``https://{api-id}.execute-api.{region}.amazonaws.com/{stage}``, a custom domain); any other is refused."""
    connection_id_pattern: str | None = None
    """CONNECTION_ID_PATTERN: a regular expression whose named group ``id`` is the connection id inside the item's
    connection attribute (e.g. ``^conn#(?P<id>.+)$`` when ATTR_CONNECTION_ID=pk holds ``conn#<id>``); a value it
    does not match fails its record (permanent) and is never sent to DeleteConnection. Unset: the attribute is the
    id."""
    kms_key_id: str | None = None
    """KMS_KEY_ID: the grants' key (its ARN), used when the item has no kmsKeyId."""
    allowed_kms_key_ids: Names = ()
    """ALLOWED_KMS_KEY_IDS: comma-separated key ARNs an item's kmsKeyId may name besides KMS_KEY_ID; a grant on any
    other key is kept (RetireGrant is authorised by the grant, so IAM cannot limit the keys: this list does)."""
    session_table: str | None = None
    """SESSION_TABLE: the table holding the sessions; a record of any other table is skipped. Unset, only the Lambda
    handler and the stream poller clean (taking their stream's table); replay and redrive refuse to start."""
    session_key_prefix: str | None = None
    """SESSION_KEY_PREFIX: only items whose partition key starts with this (e.g. ``session#``) are sessions."""
    session_sort_key: str | None = None
    """SESSION_SORT_KEY: only items whose sort key equals this (e.g. ``metadata``) are sessions; for tables whose
    partition holds other rows besides the session's."""
    session_binding: Binding = Binding.OWN
    """SESSION_BINDING: which of the grant, scratch prefix and room memberships an item names are its session's, read
    before they are freed (one ListGrants by grant id before the RetireGrant; ``<id>`` is the item key's id, the
    partition key less SESSION_KEY_PREFIX or ``session#``). ``own``: a grant named ``session:<id>``, or unnamed with
    this worker as its retiring principal (a grant made for the worker to retire); a prefix that is exactly
    ``<root>[<tenant>/]<id>/``, or any prefix when the key names no id; memberships the registry says ``<id>`` holds,
    or any of the connection's when the key names no id. ``strict``: only a grant named ``session:<id>``, a prefix
    ``<root>[<tenant>/]<id>/`` and memberships ``<id>`` holds, as the write path (``cleanup.application_contract``)
    writes them. ``off``: whatever the item names. An unbound one is kept and its record fails permanently
    (docs/decides.md, "Resources bound to their session"); ``true`` and ``false`` are read as ``strict`` and
    ``off``."""
    attributes: AttributeNames = Field(default_factory=AttributeNames)
    global_table: bool = False
    """GLOBAL_TABLE: SESSION_TABLE is a global table with a worker in each of its regions: a session is cleaned only
    by the region its item names (execute-api callbackUrl, kmsKeyId ARN, ATTR_HOME_REGION; ``cleanup.core.region``), and
    skipped elsewhere (``SessionsElsewhere``)."""
    scratch_bucket_region: str | None = None
    """SCRATCH_BUCKET_REGION: the region of SCRATCH_BUCKET, required with GLOBAL_TABLE (declared: read by no call). A
    session of this region whose bucket is in another is not cleaned (the bucket is shared between regions)."""
    registry_table: str | None = None
    """REGISTRY_TABLE: the connection registry (one item per room membership of a connection); unset: memberships
    are left to their own TTL."""
    registry_connection_index: str = "byConnection"
    """REGISTRY_CONNECTION_INDEX: the registry's global secondary index keyed on the connection id."""

    # Which action kinds run, and the http-close action's own.
    actions: Annotated[tuple[str, ...], NoDecode] = ("connection", "grant", "scratch", "registry")
    """ACTIONS: the action kinds to run, comma-separated, in order: the built-ins, and any installed through the
    ``session_cleanup.actions`` entry points. An unknown name is refused at start."""
    close_url: str | None = None
    """CLOSE_URL: the URL that closes a connection, a template with ``{connectionId}`` (HTTPS, or HTTP on loopback)."""
    close_method: str = "DELETE"
    """CLOSE_METHOD: the HTTP method of the close call."""
    allowed_close_hosts: Names = ()
    """ALLOWED_CLOSE_HOSTS: comma-separated hosts CLOSE_URL may name; any other is refused."""
    close_sigv4_service: str | None = None
    """CLOSE_SIGV4_SERVICE: sign the close call with SigV4 for this service (``execute-api`` for an API Gateway,
    ``lambda`` for a Lambda function URL), with the worker's credentials and region; unset: unsigned."""
    close_gone_statuses: Annotated[frozenset[int], NoDecode] = frozenset({410})
    """CLOSE_GONE_STATUSES: comma-separated HTTP statuses the gateway answers a close with for a connection that is
    already closed (``already-done``); any other answer but a 2xx is a failure. 4xx only, not 429 (a 404 is what a
    wrong path answers too: list it only if the gateway answers it for a closed connection, which ``check`` tries)."""
    close_id_pattern: str = r"[A-Za-z0-9._~:=+/-]{1,256}"
    """CLOSE_ID_PATTERN: a regular expression the whole connection id must match (after CONNECTION_ID_PATTERN) to be
    sent; an id that does not, and an empty, ``.`` or ``..`` id, fails its record (permanent) and is never sent."""

    # How.
    cleanup_mode: CleanupMode = CleanupMode.ENFORCE
    """CLEANUP_MODE: ``enforce`` or ``dry-run``."""
    race_check: bool = True
    """RACE_CHECK: read the live item before acting and leave alone what it still holds."""
    fence_read_max_age_seconds: float = Field(default=0.25, gt=0, le=5, allow_inf_nan=False)
    """FENCE_READ_MAX_AGE_SECONDS: the oldest a fence's read of the live item may be when the freeing call it allowed
    is sent (counted from the read's answer, checked at the send, after every wait); an older one is read again."""
    dead_letter_queue_url: str | None = None
    """DEAD_LETTER_QUEUE_URL: SQS queue for records that failed permanently (full record and error)."""
    backlog_queue_url: str | None = None
    """BACKLOG_QUEUE_URL: SQS queue for records whose cleanup could only wait (a quota, or time running out on
    transient errors): each goes there with the actions it has left, and counts as handled; ``worker.backlog``
    drains it. Unset, or set without INTEGRITY_KEY_ID (the drain refuses untagged messages; ``check`` says so): such
    records are reported failed and retried from the stream."""
    backlog_maximum_concurrency: int = Field(default=2, ge=1, le=1000)
    """BACKLOG_MAXIMUM_CONCURRENCY: the drain's invocations at once (its mapping's MaximumConcurrency), each in an
    environment of its own: a drain that has learnt no rate starts at the rate learnt by the worker that deferred to it,
    divided by this (the rest is the other environments', on the same quota)."""
    quota_wait_seconds: float | None = Field(default=None, ge=0)
    """QUOTA_WAIT_SECONDS: the longest a request waits for a turn at a throttling service's learnt rate; a request
    with no turn that soon is not sent and its record is deferred to the backlog. Unset: up to the deadline."""
    dead_letter_bucket: str | None = None
    """DEAD_LETTER_BUCKET: where a record too large for one message is stored (the message names the object);
    unset: SCRATCH_BUCKET."""
    dead_letter_prefix: str = "dead-letter/"
    """DEAD_LETTER_PREFIX: key prefix of those objects; in the scratch bucket it must lie outside SCRATCH_ROOT."""
    integrity_key_id: str | None = None
    """INTEGRITY_KEY_ID: the KMS HMAC key (HMAC_256) that tags every dead-letter and backlog message the worker
    writes (GenerateMac) and that the drain and redrive verify (VerifyMac) before they free anything a message names.
    Unset: messages are written untagged, and the drain and redrive free nothing from one (they keep it)."""
    integrity_previous_key_ids: Names = ()
    """INTEGRITY_PREVIOUS_KEY_IDS: comma-separated ARNs of HMAC keys INTEGRITY_KEY_ID replaced, accepted to verify a
    message's tag (never to make one): a message tagged before a rotation is still trusted while it waits, and
    ``cleanup-worker retag`` tags it again with INTEGRITY_KEY_ID (docs/operate.md, "Rotating the integrity key")."""
    max_concurrency: int = Field(default=32, ge=1, le=512)
    """MAX_CONCURRENCY: records cleaned at once (threads; the HTTP pool is sized to match)."""
    retry_attempts: int = Field(default=4, ge=1, le=20)
    """RETRY_ATTEMPTS: tries of one action on transient errors, within the invocation's time."""
    retry_max_wait_seconds: float = Field(default=2.0, gt=0)
    """RETRY_MAX_WAIT_SECONDS: the longest backoff between two tries."""
    botocore_max_attempts: int = Field(default=3, ge=1, le=10)
    """BOTOCORE_MAX_ATTEMPTS: botocore's own (standard mode) attempts per call, below ours."""
    http_timeout_seconds: float = Field(default=5.0, gt=0)
    """HTTP_TIMEOUT_SECONDS: read timeout of the short AWS calls (DeleteConnection, RetireGrant, BatchGetItem, ...), and
    connect timeout of every call (at most 0.5 s)."""
    bulk_timeout_seconds: float = Field(default=30.0, gt=0)
    """BULK_TIMEOUT_SECONDS: read timeout of S3 listings and DeleteObjects, which can take seconds on real S3 (a
    listing across many delete markers, a DeleteObjects of 1,000 versions)."""
    call_wait_seconds: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    """CALL_WAIT_SECONDS: the longest an AWS call waits for a turn or a concurrency slot of its service, where no
    deadline bounds it sooner (poller, replay, redrive, sweeper, KCL); then it fails, transient."""

    # The kill switch (an AppConfig feature flag, read through the local AppConfig agent or Lambda extension).
    appconfig_application: str | None = None
    """APPCONFIG_APPLICATION: the AppConfig application of the kill switch; unset (with the next two): no switch."""
    appconfig_environment: str | None = None
    """APPCONFIG_ENVIRONMENT: its AppConfig environment."""
    appconfig_profile: str | None = None
    """APPCONFIG_PROFILE: its feature-flag profile (flag ``cleanup``: see cleanup.killswitch)."""
    appconfig_agent_url: str = "http://localhost:2772"
    """APPCONFIG_AGENT_URL: the AppConfig agent's or Lambda extension's local endpoint (loopback only)."""
    appconfig_poll_seconds: float = Field(default=15.0, ge=0)
    """APPCONFIG_POLL_SECONDS: how long a reading of the switch is kept before it is read again."""

    # Telemetry.
    log_level: str = "INFO"
    """LOG_LEVEL."""
    log_identifiers: LogIdentifiers = LogIdentifiers.PLAIN
    """LOG_IDENTIFIERS: ``plain``, or ``hashed``: connection, grant, key, bucket, prefix, item key, tenant and session
    ids are logged as ``hmac:<16 hex>``, an HMAC-SHA256 under LOG_HASH_KEY, the same value the same hash throughout a
    deployment (and in any text of the same line that quotes it)."""
    log_hash_key: SecretStr | None = None
    """LOG_HASH_KEY: the key of those hashes. Unset: derived from SERVICE_NAME, SESSION_TABLE, KMS_KEY_ID and
    SCRATCH_BUCKET, stable within a deployment but not secret (whoever knows them can hash a guessed tenant id)."""
    metrics_namespace: str = "SessionCleanup"
    """METRICS_NAMESPACE: CloudWatch namespace of the EMF metrics."""
    metrics_destination: str = "auto"
    """METRICS_DESTINATION: ``stdout``, ``stderr``, ``off``, ``tcp://host:port`` / ``udp://host:port`` (a CloudWatch
    agent), or ``auto``: stdout in Lambda, stderr elsewhere."""
    service_name: str = Field(
        default="session-cleanup",
        validation_alias=AliasChoices("SERVICE_NAME", "POWERTOOLS_SERVICE_NAME"),
    )
    """SERVICE_NAME: the ``service`` field of logs and the metrics' dimension."""

    # Container mode (stream poller and KCL record processor).
    checkpoint_table: str = "session-cleanup-checkpoints"
    """CHECKPOINT_TABLE: per-shard checkpoints and the consumer lease (created if absent)."""
    start_position: StartPosition = StartPosition.TRIM_HORIZON
    """START_POSITION: where a shard with no checkpoint starts: TRIM_HORIZON or LATEST."""
    batch_size: int = Field(default=100, ge=1, le=1000)
    """BATCH_SIZE: records per GetRecords call (the poller's batch)."""
    poll_interval_seconds: float = Field(default=1.0, ge=0)
    """POLL_INTERVAL_SECONDS: pause after an empty GetRecords on an open shard."""
    shard_discovery_seconds: float = Field(default=10.0, gt=0)
    """SHARD_DISCOVERY_SECONDS: how often DescribeStream looks for new shards."""
    lease_seconds: float = Field(default=20.0, gt=0)
    """LEASE_SECONDS: a consumer lease not renewed for this long may be taken over by a standby."""
    max_record_attempts: int = Field(default=5, ge=1)
    """MAX_RECORD_ATTEMPTS: tries of a failing record before it goes to the dead-letter queue (if one is set)."""
    max_record_retry_seconds: float = Field(default=3600.0, gt=0)
    """MAX_RECORD_RETRY_SECONDS: how long a record may keep failing, from its first try, before it goes to the
    dead-letter queue (if one is set) whatever its error: no shard waits for ever on one record."""
    shutdown_grace_seconds: float = Field(default=20.0, gt=0)
    """SHUTDOWN_GRACE_SECONDS: on SIGTERM/SIGINT, time allowed to finish the in-flight batch and checkpoint."""
    health_file: str = "/tmp/cleanup-worker.health"
    """HEALTH_FILE: touched each time the poller's loop comes round, for ``cleanup-worker health`` to read its age;
    the KCL processors mark their unanswered messages beside it (``<HEALTH_FILE>.kcl-<pid>``)."""
    stream_retention_hours: float = Field(default=24.0, ge=24, le=8760)
    """STREAM_RETENTION_HOURS: how long the KCL processor's Kinesis data stream keeps a record (its
    RetentionPeriodHours): a waiting record is warned about past half of it, and is critical four hours before it
    runs out; a checkpoint read through before it is a loss. A DynamoDB stream (the poller's) keeps 24 h, always."""
    health_stale_seconds: float | None = Field(default=None, gt=0)
    """HEALTH_STALE_SECONDS: a poll loop (or KCL message) not come round (answered) for this long is wedged: the
    health check fails and the poller no longer renews its lease. Unset: three LEASE_SECONDS."""

    # The canary and the stream check.
    canary_timeout_seconds: float = Field(default=600.0, ge=10, le=3600)
    """CANARY_TIMEOUT_SECONDS: how long the canary waits for the worker to free its session before it reports it
    not cleaned (``CanaryNotCleaned``)."""
    canary_grant_principal: str | None = None
    """CANARY_GRANT_PRINCIPAL: the worker's role ARN: the canary's session then holds a grant on KMS_KEY_ID (DescribeKey
    only) that this principal retires; unset, the canary's session holds a scratch object only."""
    event_source_mapping_uuid: str | None = None
    """EVENT_SOURCE_MAPPING_UUID: the stream's event source mapping, whose stream the stream check compares with the
    session table's latest one (Lambda)."""

    # The sweeper.
    expiry_index: str | None = None
    """EXPIRY_INDEX: the sweeper's sparse GSI (partition key the expiry bucket, sort key ttl), which the project's
    write-path helpers maintain; unset: no sweeper (``sweep`` refuses to start and says why)."""
    expiry_bucket_seconds: int = Field(default=3600, ge=60)
    """EXPIRY_BUCKET_SECONDS: width of one expiry bucket (the ttl rounded down to it)."""
    expiry_shards: int = Field(default=1, ge=1, le=100)
    """EXPIRY_SHARDS: write shards per bucket, for tables with many sessions expiring together."""
    sweep_lookback_seconds: int = Field(default=2 * 24 * 3600, ge=60)
    """SWEEP_LOOKBACK_SECONDS: how far back the sweeper looks for buckets (TTL is the backstop beyond)."""
    sweep_max_deletes: int | None = Field(default=None, ge=1)
    """SWEEP_MAX_DELETES: at most this many deletes a sweep (the rest are deferred to the next); unset: no limit."""
    sweep_max_backlog: int | None = Field(default=None, ge=0)
    """SWEEP_MAX_BACKLOG: no deletes while BACKLOG_QUEUE_URL holds more messages than this; unset: no such check."""

    # Reconcile (``cleanup-worker reconcile``: what the stream path missed).
    reconcile_grace_seconds: int = 3600
    """RECONCILE_GRACE_SECONDS: a grant or scratch prefix younger than this, or of a session past its ttl by less,
    is never freed by reconcile (a session being set up, a record still on its way through the stream). At least
    RECONCILE_GRACE_FLOOR_SECONDS: it is what keeps the grant of a session being created, whose item is not written
    yet."""
    reconcile_max_gone_share: float = Field(default=0.2, gt=0, le=1, allow_inf_nan=False)
    """RECONCILE_MAX_GONE_SHARE: a reconcile pass in which more than this share of the resources named by a session
    (and more than ten) read as gone frees nothing and says why: a stream path that works leaves few, so many is a
    table read wrongly or an outage. 1: no such stop."""
    reconcile_scratch: bool = False
    """RECONCILE_SCRATCH: reconcile also lists and frees scratch prefixes. Off by default: read at the wrong depth
    (SCRATCH_TENANT_SCOPED not the real layout), a tenant's folder would be taken for a session's; the bucket's
    lifecycle rule is the scratch data's backstop anyway. Grants, which have none, are always reconciled."""

    @field_validator(
        "allowed_callback_urls",
        "allowed_kms_key_ids",
        "integrity_previous_key_ids",
        "allowed_close_hosts",
        mode="before",
    )
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return tuple(item.strip() for item in value.split(",") if item.strip()) if isinstance(value, str) else value

    @field_validator("actions", mode="before")
    @classmethod
    def _action_names(cls, value: object) -> object:
        if isinstance(value, str):
            value = tuple(name.strip() for name in value.split(","))
        if isinstance(value, tuple | list) and not all(isinstance(n, str) and ACTION_NAME.fullmatch(n) for n in value):
            raise ValueError(f"expected comma-separated action names, got {','.join(map(str, value))[:200]!r}")
        return value

    @field_validator("close_url")
    @classmethod
    def _close_template(cls, value: str | None) -> str | None:
        if value is not None and "{connectionId}" not in value:
            raise ValueError(f"expected a URL template with {{connectionId}}, got {value[:200]!r}")
        return value

    @field_validator("close_method")
    @classmethod
    def _close_method(cls, value: str) -> str:
        if value.upper() not in ("DELETE", "POST", "PUT", "GET"):
            raise ValueError(f"expected DELETE, POST, PUT or GET, got {value[:20]!r}")
        return value.upper()

    @field_validator("close_gone_statuses", mode="before")
    @classmethod
    def _close_gone(cls, value: object) -> object:
        text = value if isinstance(value, str) else ",".join(map(str, value)) if isinstance(value, Iterable) else ""
        statuses = [status.strip() for status in text.split(",") if status.strip()]
        bad = [status for status in statuses if not (status.isdigit() and 400 <= int(status) < 500 and status != "429")]
        if not statuses or bad:
            raise ValueError(f"expected comma-separated 4xx statuses other than 429 (e.g. 410), got {text[:60]!r}")
        return frozenset(int(status) for status in statuses)

    @field_validator("close_id_pattern")
    @classmethod
    def _close_id_pattern(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"CLOSE_ID_PATTERN is not a regular expression ({exc}): {value[:200]!r}") from exc
        return value

    @field_validator("session_binding", mode="before")
    @classmethod
    def _binding_of_old(cls, value: object) -> object:
        if isinstance(value, bool):
            return Binding.STRICT if value else Binding.OFF
        return _BINDING_ALIASES.get(value.lower(), value) if isinstance(value, str) else value

    @field_validator("scratch_root")
    @classmethod
    def _root_is_a_folder(cls, root: str) -> str:
        if not root or not root.endswith("/") or root.startswith("/"):
            raise ValueError("SCRATCH_ROOT must be a non-empty key prefix ending in '/' (e.g. 'sessions/')")
        if any(part in ("", ".", "..") for part in root[:-1].split("/")):
            raise ValueError("SCRATCH_ROOT must not contain empty, '.' or '..' segments")
        return root

    @field_validator("dead_letter_prefix")
    @classmethod
    def _dead_letter_prefix_is_a_folder_outside_the_root(cls, prefix: str, info: ValidationInfo) -> str:
        if not prefix.endswith("/") or not _SAFE_PREFIX.fullmatch(prefix) or prefix.startswith("/"):
            raise ValueError(
                "DEAD_LETTER_PREFIX must be a key prefix ending in '/', of letters, digits and /!_.'()- only: "
                f"{prefix!r}"
            )
        if any(part in ("", ".", "..") for part in prefix[:-1].split("/")):
            raise ValueError("DEAD_LETTER_PREFIX must not contain empty, '.' or '..' segments")
        root = info.data.get("scratch_root")
        if cls.refuse_dead_letter_overlap and root is not None:
            overlap = dead_letter_overlap(
                info.data.get("scratch_bucket"), root, info.data.get("dead_letter_bucket"), prefix
            )
            if overlap:
                raise ValueError(f"{overlap}: {DEAD_LETTER_OVERLAP_FIX}")
        return prefix

    @field_validator("connection_id_pattern")
    @classmethod
    def _pattern_names_the_id(cls, pattern: str | None) -> str | None:
        if pattern is None:
            return None
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"CONNECTION_ID_PATTERN is not a regular expression ({exc}): {pattern!r}") from exc
        if "id" not in compiled.groupindex:
            raise ValueError(f"CONNECTION_ID_PATTERN needs a named group 'id', e.g. '^conn#(?P<id>.+)$': {pattern!r}")
        return pattern

    @field_validator("kms_key_id")
    @classmethod
    def _key_is_a_key_arn(cls, key: str | None) -> str | None:
        # RetireGrant takes the key ARN: an alias would fail every retire at run time, after the grant's item is gone.
        if key is not None and not KMS_KEY_ARN.fullmatch(key):
            raise ValueError(f"KMS_KEY_ID must be the key's ARN (arn:aws:kms:<region>:<account>:key/<key-id>): {key!r}")
        return key

    @field_validator("reconcile_grace_seconds")
    @classmethod
    def _grace_is_above_a_create(cls, grace: int) -> int:
        if grace < RECONCILE_GRACE_FLOOR_SECONDS:
            raise ValueError(
                f"RECONCILE_GRACE_SECONDS must be at least {RECONCILE_GRACE_FLOOR_SECONDS} (got {grace}): a session's "
                "grant exists before its item, and the grace is what keeps the grant of a session being created"
            )
        return grace

    @field_validator("allowed_kms_key_ids")
    @classmethod
    def _allowed_keys_are_key_arns(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        # An alias or a bare key id could never equal the ARN an item names: a typo would refuse every such grant.
        bad = [key for key in keys if not KMS_KEY_ARN.fullmatch(key)]
        if bad:
            raise ValueError(
                "ALLOWED_KMS_KEY_IDS must list key ARNs (arn:aws:kms:<region>:<account>:key/<key-id>), not "
                + ", ".join(repr(key) for key in bad)
            )
        return keys

    @field_validator("integrity_previous_key_ids")
    @classmethod
    def _previous_keys_are_key_arns(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        # The drain's role may verify with the keys the template names, by ARN: another spelling would never verify.
        bad = [key for key in keys if not KMS_KEY_ARN.fullmatch(key)]
        if bad:
            raise ValueError(
                "INTEGRITY_PREVIOUS_KEY_IDS must list key ARNs (arn:aws:kms:<region>:<account>:key/<key-id>), not "
                + ", ".join(repr(key) for key in bad)
            )
        return keys

    @field_validator("metrics_destination")
    @classmethod
    def _metrics_destination_is_known(cls, destination: str) -> str:
        if destination in METRICS_STREAMS:
            return destination
        url = urlsplit(destination)
        try:
            port = url.port
        except ValueError:
            port = None
        if url.scheme not in ("tcp", "udp") or not url.hostname or not port:
            raise ValueError(
                f"METRICS_DESTINATION must be stdout, stderr, off, auto or tcp/udp://host:port: {destination!r}"
            )
        return destination

    @field_validator("appconfig_agent_url")
    @classmethod
    def _agent_is_local(cls, url: str) -> str:
        # The switch can pause the worker: only a process on this host (the agent, the extension) may answer for it.
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname not in ("localhost", "127.0.0.1", "::1"):
            raise ValueError(f"APPCONFIG_AGENT_URL must be http://localhost:<port> (the local agent): {url!r}")
        return url.rstrip("/")

    @property
    def kill_switch(self) -> tuple[str, str, str] | None:
        """The switch's (application, environment, profile), or None when the environment alone decides."""
        app, env, profile = self.appconfig_application, self.appconfig_environment, self.appconfig_profile
        return (app, env, profile) if app and env and profile else None

    @field_validator("scratch_bucket_region")
    @classmethod
    def _bucket_region_is_a_region(cls, region: str | None) -> str | None:
        if region is not None and not REGION_NAME.fullmatch(region):
            raise ValueError(f"SCRATCH_BUCKET_REGION must be a region's name (e.g. us-east-1): {region!r}")
        return region

    @model_validator(mode="after")
    def _regions_are_known(self) -> Settings:
        if self.global_table and self.scratch_bucket and self.scratch_bucket_region is None:
            raise ValueError("GLOBAL_TABLE needs SCRATCH_BUCKET_REGION: the region of SCRATCH_BUCKET")
        if self.attributes.home_region is not None and not self.global_table:
            raise ValueError("ATTR_HOME_REGION is read only with GLOBAL_TABLE=true: set both, or neither")
        return self

    @model_validator(mode="after")
    def _switch_is_whole(self) -> Settings:
        names = (self.appconfig_application, self.appconfig_environment, self.appconfig_profile)
        if any(names) and not all(names):  # half a switch would be silently ignored
            raise ValueError("APPCONFIG_APPLICATION, APPCONFIG_ENVIRONMENT and APPCONFIG_PROFILE go together")
        return self

    @field_validator("log_level")
    @classmethod
    def _log_level_is_known(cls, level: str) -> str:
        if level.upper() not in LOG_LEVELS:
            raise ValueError(f"LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL: {level!r}")
        return level

    @property
    def stale_after(self) -> float:
        """HEALTH_STALE_SECONDS, or three LEASE_SECONDS: longer than a batch attempt throttled to its deadline."""
        return self.health_stale_seconds or 3 * self.lease_seconds

    def health_bound_problem(self) -> str | None:
        """Why HEALTH_STALE_SECONDS cannot tell a KCL processor working towards a verdict from a wedged one, or None.

        The processor comes round between attempts at a batch, never during one, and an attempt runs up to
        SHUTDOWN_GRACE_SECONDS: a health bound no longer than that would have a processor that retries a record
        replaced, again and again, before MAX_RECORD_RETRY_SECONDS could give the record up.
        """
        if self.stale_after > self.shutdown_grace_seconds:
            return None
        return (
            f"{self.stale_after:g} s must be longer than SHUTDOWN_GRACE_SECONDS "
            f"({self.shutdown_grace_seconds:g}), the longest one attempt at a batch runs: shorter, the health check "
            "would restart a processor retrying a record before MAX_RECORD_RETRY_SECONDS could give it up"
        )

    @property
    def backlog_for_writing(self) -> str | None:
        """BACKLOG_QUEUE_URL when records may be sent there: only with INTEGRITY_KEY_ID, since the drain refuses
        (and keeps for an operator) every message it cannot verify; without it records stay in the stream instead."""
        return self.backlog_queue_url if self.integrity_key_id else None

    @property
    def integrity_keys(self) -> tuple[str, ...]:
        """The keys a message's tag may verify with: INTEGRITY_KEY_ID first, then INTEGRITY_PREVIOUS_KEY_IDS (none
        without INTEGRITY_KEY_ID: a previous key alone never vouches for anything)."""
        if not self.integrity_key_id:
            return ()
        return tuple(dict.fromkeys([self.integrity_key_id, *self.integrity_previous_key_ids]))

    @property
    def dead_letter_store(self) -> str | None:
        """The bucket of records too large for a dead-letter message: DEAD_LETTER_BUCKET, else SCRATCH_BUCKET."""
        return self.dead_letter_bucket or self.scratch_bucket

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the settings from the process environment, or from ``environ`` in its place (a command run with a
        deployed function's settings); the entry point's job.

        Raises:
            pydantic.ValidationError: a setting is invalid.
        """
        with _reading(environ):
            return cls()


SESSION_SHAPE = frozenset(
    {
        "SESSION_KEY_PREFIX",
        "SESSION_SORT_KEY",
        "SCRATCH_ROOT",
        "SCRATCH_TENANT_SCOPED",
        "CONNECTION_ID_PATTERN",
        "GLOBAL_TABLE",
        "SCRATCH_BUCKET_REGION",
        "SESSION_BINDING",
        *(f"ATTR_{name.upper()}" for name in AttributeNames.model_fields),
    }
)
"""The settings that shape what a session is and what it holds: every deployed function that reads records or items
has them, from the same template parameters (a function reading another shape would skip or misread sessions)."""


def variables() -> tuple[str, ...]:
    """Every environment variable the worker's settings read (``Settings``, every alias, ``ATTR_*``)."""
    names = []
    for name, field in Settings.model_fields.items():
        if name == "attributes":
            continue
        alias = field.validation_alias
        names += [str(choice) for choice in alias.choices] if isinstance(alias, AliasChoices) else [name.upper()]
    return (*names, *(f"ATTR_{name.upper()}" for name in AttributeNames.model_fields))


NOT_DEPLOYED = {
    "RACE_CHECK": "the fence is never turned off in a deployment (tests and benchmarks only)",
    "CALL_WAIT_SECONDS": "bounds waits where no deadline does: containers, commands (Lambda has its invocation's)",
    "APPCONFIG_AGENT_URL": "the Lambda extension always answers on localhost:2772 (containers: the agent's port)",
    "METRICS_DESTINATION": "in Lambda, auto is stdout, where CloudWatch Logs reads embedded metrics",
    "CHECKPOINT_TABLE": "containers only: Lambda's event source mapping keeps its own place",
    "START_POSITION": "containers only: the mapping's StartingPosition parameter",
    "BATCH_SIZE": "containers only: the mapping's BatchSize parameter",
    "POLL_INTERVAL_SECONDS": "containers only",
    "SHARD_DISCOVERY_SECONDS": "containers only",
    "LEASE_SECONDS": "containers only",
    "MAX_RECORD_ATTEMPTS": "containers only: the mapping's MaximumRetryAttempts parameter",
    "MAX_RECORD_RETRY_SECONDS": "containers only: the mapping's MaximumRecordAgeInSeconds parameter",
    "SHUTDOWN_GRACE_SECONDS": "containers only",
    "HEALTH_FILE": "containers only",
    "HEALTH_STALE_SECONDS": "containers only",
    "STREAM_RETENTION_HOURS": "the KCL processor's Kinesis stream only; Lambda's age alarms are at 12 h and 20 h",
}
"""Settings no template parameter sets, and why (a test holds every other setting to a parameter)."""


DEAD_LETTER_OVERLAP_FIX = (
    "set DEAD_LETTER_PREFIX to a prefix outside the root (e.g. 'dead-letter/'), or DEAD_LETTER_BUCKET to another bucket"
)


def dead_letter_overlap(
    scratch_bucket: str | None, scratch_root: str, dead_letter_bucket: str | None, dead_letter_prefix: str
) -> str | None:
    """Why dead-letter objects would share the scratch root (whose keys the worker deletes), or None when they do not.

    Either prefix lying under the other counts: dead-letter objects under the root could be deleted as scratch data
    (or expired by the root's lifecycle backstop), and a prefix above the root would let the worker write into it.
    """
    if not scratch_bucket or (dead_letter_bucket or scratch_bucket) != scratch_bucket:
        return None
    if not (dead_letter_prefix.startswith(scratch_root) or scratch_root.startswith(dead_letter_prefix)):
        return None
    return (
        f"DEAD_LETTER_PREFIX {dead_letter_prefix!r} overlaps SCRATCH_ROOT {scratch_root!r} in the scratch bucket "
        f"{scratch_bucket!r}, where the worker deletes"
    )


def configuration_problems(error: ValidationError) -> dict[str, str]:
    """Each invalid setting's environment variable (upper-case) and why, one short line each."""
    problems: dict[str, str] = {}
    for item in error.errors(include_url=False):
        name = _variable(item["loc"], error.title)
        why = str(item["msg"]).removeprefix("Value error, ").removeprefix(f"{name} ")
        if item["type"] != "value_error":  # pydantic's own: "Input should be ..."; ours already quote the value
            field = next((part for part in reversed(item["loc"]) if isinstance(part, str)), "value")
            why = f"{why.replace('Input ', f'{field} ', 1)} (got {_short(item.get('input'))})"
        problems[name] = f"{problems[name]}; {why}" if name in problems else why
    return {name: " ".join(why.split()) for name, why in problems.items()}


def _variable(loc: tuple[int | str, ...], model: str) -> str:
    """The environment variable a validation error's location stands for."""
    fields = [part for part in loc if isinstance(part, str)]
    if fields[:1] == ["attributes"] or model == AttributeNames.__name__:
        fields = [name for name in fields if name != "attributes"]
        return f"ATTR_{fields[0].upper()}" if fields else "ATTR_*"
    if not fields:
        return "SETTINGS"
    field = Settings.model_fields.get(fields[0])
    alias = field.validation_alias if field else None
    return str(alias.choices[0] if isinstance(alias, AliasChoices) else fields[0]).upper()


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."
