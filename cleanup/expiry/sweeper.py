"""The sweeper: delete the sessions whose ttl has passed, on time, instead of whenever DynamoDB TTL gets to them.

For every expiry bucket (and shard) from ``SWEEP_LOOKBACK_SECONDS`` ago up to now, one paginated Query of the sparse
index (partition key the bucket, sort key ``ttl``) for the items whose ttl has passed: never a Scan. Each one is
deleted with a conditional DeleteItem: ``ttl`` still equal to the value read, and in the past. A heartbeat that
refreshed the session in between changed its ttl, so the delete fails and the session lives on (counted as kept).
Every delete is an ordinary REMOVE on the table's stream, which the worker cleans up with reason ``expired``.

Queries and deletes run concurrently on the runtime's bounded pool. With ``CLEANUP_MODE=dry-run`` nothing is deleted:
the expired sessions are only counted.

Backpressure: the sweeper deletes no faster than cleanup absorbs. A sweep deletes at most SWEEP_MAX_DELETES sessions
(about what the stream's cleanup takes in a sweep's minute), and none while the backlog of quota-bound work
(BACKLOG_QUEUE_URL) holds more than SWEEP_MAX_BACKLOG messages, or its depth cannot be read; the sessions left are
counted ``deferred`` (the next sweep, or DynamoDB TTL, takes them) and the summary's ``backpressure`` says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, as_completed
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from cleanup.aws.aws_errors import error_code
from cleanup.aws.calls import call
from cleanup.aws.retry import call_with_retry
from cleanup.core.classify import not_a_session_key
from cleanup.deadline import Deadline
from cleanup.exceptions import CleanupError, ConditionFailedError, MissingConfigError, PermanentError
from cleanup.expiry.sweep_report import Expired
from cleanup.expiry.sweep_report import SweepReport as SweepReport
from cleanup.expiry.sweep_report import Verdict as Verdict
from cleanup.runtime import Runtime
from cleanup.telemetry import log
from schemas.convention import expiry_buckets
from schemas.settings import CleanupMode, Settings

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import QueryInputTypeDef, QueryOutputTypeDef


def sweep(
    runtime: Runtime,
    *,
    table: str | None = None,
    now: int | None = None,
    deadline: Deadline | None = None,
    page_size: int | None = None,
    progress: Callable[[int, int], object] | None = None,
) -> SweepReport:
    """Delete every session of ``table`` (default ``SESSION_TABLE``) whose ttl is before ``now``.

    ``progress(done, total)`` is told of every expiry bucket read (a command's progress bar).

    Raises:
        MissingConfigError: no table to sweep, no EXPIRY_INDEX, or the table has no such index (the first query to
            find out stops the sweep: the others are cancelled or not reported).
    """
    settings = runtime.settings
    table = table or settings.session_table
    if not table:
        raise MissingConfigError("nothing to sweep: set SESSION_TABLE (or pass the table)")
    if not settings.expiry_index:
        raise MissingConfigError(
            "the sweeper needs its expiry index: set EXPIRY_INDEX to the table's sparse index (partition key "
            f"{settings.attributes.expiry_bucket!r}, sort key {settings.attributes.ttl!r}), which the write-path "
            "helpers maintain (docs/operate.md, 'The sweeper'); without one, expiry is left to DynamoDB TTL"
        )
    now = int(time.time()) if now is None else now
    deadline = deadline or Deadline()
    buckets = expiry_buckets(
        now - settings.sweep_lookback_seconds,
        now,
        bucket_seconds=settings.expiry_bucket_seconds,
        shards=settings.expiry_shards,
    )
    report = SweepReport(buckets=len(buckets), backpressure=_backlog_full(runtime, deadline))
    allowed = 0 if report.backpressure else settings.sweep_max_deletes
    pool = runtime.executor
    queries = {pool.submit(_expired_in, runtime, table, bucket, now, deadline, page_size): bucket for bucket in buckets}
    deletes: list[Future[Verdict]] = []
    for done, query in enumerate(as_completed(queries), start=1):
        if progress is not None:
            progress(done, len(buckets))
        try:
            found = query.result()
        except MissingConfigError:
            for pending in queries:
                pending.cancel()
            raise
        except CleanupError as exc:
            report.failed_buckets += 1
            log.warning("sweep query failed", extra={"table": table, "bucket": queries[query], "error": str(exc)})
            continue
        if allowed is not None and len(deletes) + len(found) > allowed:
            report.verdicts[Verdict.DEFERRED] += len(deletes) + len(found) - allowed
            found = found[: max(0, allowed - len(deletes))]
            report.backpressure = report.backpressure or f"SWEEP_MAX_DELETES {allowed} reached: the rest wait"
        deletes += [pool.submit(_remove, runtime, table, expired, now, deadline, report.lags) for expired in found]
    report.verdicts.update(delete.result() for delete in deletes)
    _emit(runtime, report)
    log.info("sweep finished", extra={"table": table, **report.summary()})
    return report


def _backlog_full(runtime: Runtime, deadline: Deadline) -> str | None:
    """Why this sweep deletes nothing: the backlog is deeper than SWEEP_MAX_BACKLOG, or its depth is unknown."""
    settings = runtime.settings
    limit, queue = settings.sweep_max_backlog, settings.backlog_queue_url
    if limit is None or not queue:
        return None
    try:
        answer = call(
            runtime.clients.sqs.get_queue_attributes,
            "GetQueueAttributes",
            deadline,
            QueueUrl=queue,
            AttributeNames=["ApproximateNumberOfMessages"],
        )
        depth = int(answer.get("Attributes", {})["ApproximateNumberOfMessages"])
    except (CleanupError, KeyError, ValueError) as exc:
        return f"the backlog's depth is unknown ({str(exc)[:200]}): nothing deleted"
    if depth > limit:
        return f"the backlog holds {depth} messages, over SWEEP_MAX_BACKLOG {limit}: nothing deleted"
    return None


def _expired_in(
    runtime: Runtime, table: str, bucket: str, now: int, deadline: Deadline, page_size: int | None
) -> list[Expired]:
    """Every index entry of one bucket whose ttl is before ``now``, all pages."""
    names = runtime.settings.attributes
    request: QueryInputTypeDef = {
        "TableName": table,
        "IndexName": runtime.settings.expiry_index or "",  # sweep() refuses to run without one
        # Strictly before now, as DynamoDB TTL counts an item expired; the delete's condition says the same.
        "KeyConditionExpression": "#bucket = :bucket AND #ttl < :now",
        "ProjectionExpression": "#pk, #sk, #ttl",
        "ExpressionAttributeNames": {
            "#bucket": names.expiry_bucket,
            "#ttl": names.ttl,
            "#pk": names.pk,
            "#sk": names.sk,
        },
        "ExpressionAttributeValues": {":bucket": {"S": bucket}, ":now": {"N": str(now)}},
    }
    if page_size is not None:
        request["Limit"] = page_size
    found: list[Expired] = []
    while True:
        page = call_with_retry(lambda: _query(runtime, request, deadline), runtime.settings, deadline)
        found += [_expired(item, runtime.settings) for item in page.get("Items", []) if _is_session(item, runtime)]
        if "LastEvaluatedKey" not in page:
            return found
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _query(runtime: Runtime, request: QueryInputTypeDef, deadline: Deadline) -> QueryOutputTypeDef:
    try:
        return call(runtime.clients.dynamodb.query, "Query", deadline, **request)
    except PermanentError as exc:
        if _no_index(exc):
            table, index = request["TableName"], request.get("IndexName")
            raise MissingConfigError(
                f"table {table!r} has no index {index!r}: create the sweeper's sparse index (partition key "
                f"{runtime.settings.attributes.expiry_bucket!r}, sort key {runtime.settings.attributes.ttl!r}; "
                "docs/operate.md, 'The sweeper'), or set EXPIRY_INDEX to its name"
            ) from exc
        raise


def _no_index(exc: PermanentError) -> bool:
    """Whether a Query failed for want of its index (DynamoDB: ValidationException; some emulators: not found)."""
    cause = exc.__cause__
    if not isinstance(cause, ClientError):
        return False
    code, message = error_code(cause), str(cause.response.get("Error", {}).get("Message", ""))
    return code in ("ValidationException", "ResourceNotFoundException") and "index" in message.lower()


def _is_session(item: dict[str, Any], runtime: Runtime) -> bool:
    """Only sessions are swept: an item of the index outside SESSION_KEY_PREFIX / SESSION_SORT_KEY (an invitation, a
    connection's other rows) that carries a ttl is left to DynamoDB TTL, as the worker would skip its REMOVE."""
    why = not_a_session_key(item, runtime.settings)
    if why is not None:
        log.debug("sweep: index entry is not a session", extra={"key": _key_text(_expired(item, runtime.settings))})
    return why is None


def _expired(item: dict[str, Any], settings: Settings) -> Expired:
    names = settings.attributes
    key = {name: item[name] for name in (names.pk, names.sk) if name in item}
    return Expired(key=key, ttl=item[names.ttl])


def _remove(runtime: Runtime, table: str, expired: Expired, now: int, deadline: Deadline, lags: list[float]) -> Verdict:
    """Delete one expired session unless it was refreshed or removed since it was read."""
    if runtime.settings.cleanup_mode is CleanupMode.DRY_RUN:
        return Verdict.PLANNED
    if deadline.remaining() <= 0:
        return Verdict.DEFERRED
    try:
        verdict = call_with_retry(lambda: _delete(runtime, table, expired, now, deadline), runtime.settings, deadline)
    except CleanupError as exc:
        log.warning("sweep delete failed", extra={"table": table, "key": _key_text(expired), "error": str(exc)})
        return Verdict.FAILED
    if verdict is Verdict.SWEPT:
        lags.append(time.time() - expired.ttl_seconds)  # list.append is atomic: no lock for the pool's threads
    return verdict


def _delete(runtime: Runtime, table: str, expired: Expired, now: int, deadline: Deadline) -> Verdict:
    try:
        call(
            runtime.clients.dynamodb.delete_item,
            "DeleteItem",
            deadline,
            TableName=table,
            Key=expired.key,
            **_condition(runtime.settings, expired, now),
            # Tells a refreshed session (item returned) from one already deleted (none), at no extra call.
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    except ConditionFailedError as exc:
        return Verdict.KEPT if exc.item else Verdict.GONE
    return Verdict.SWEPT


def _condition(settings: Settings, expired: Expired, now: int) -> dict[str, Any]:
    """The delete's condition: the ttl as read and past, and (when configured) a session's key, checked again by
    DynamoDB itself."""
    names = settings.attributes
    conditions = ["#ttl = :read", "#ttl < :now"]
    attribute_names = {"#ttl": names.ttl}
    values: dict[str, Any] = {":read": expired.ttl, ":now": {"N": str(now)}}
    if settings.session_key_prefix:
        conditions.append("begins_with(#pk, :prefix)")
        attribute_names["#pk"] = names.pk
        values[":prefix"] = {"S": settings.session_key_prefix}
    if settings.session_sort_key is not None:
        conditions.append("#sk = :sort")
        attribute_names["#sk"] = names.sk
        values[":sort"] = {"S": settings.session_sort_key}
    return {
        "ConditionExpression": " AND ".join(conditions),
        "ExpressionAttributeNames": attribute_names,
        "ExpressionAttributeValues": values,
    }


def _emit(runtime: Runtime, report: SweepReport) -> None:
    metrics = runtime.metrics
    metrics.count("SessionsSwept", amount=report.verdicts[Verdict.SWEPT])
    for verdict in (Verdict.KEPT, Verdict.GONE, Verdict.DEFERRED, Verdict.FAILED):
        if report.verdicts[verdict]:
            metrics.count("SessionsNotSwept", "Verdict", verdict.value, amount=report.verdicts[verdict])
    if report.failed_buckets:
        metrics.count("SweepQueryFailures", amount=report.failed_buckets)
    for lag in report.lags:
        metrics.observe("SweepLagSeconds", lag)
    metrics.flush()


def _key_text(expired: Expired) -> str:
    return ",".join(f"{name}={next(iter(value.values()))}" for name, value in sorted(expired.key.items()))
