"""Reconcile: free what the stream path missed (records lost before the worker saw them).

It lists the grants on the worker's keys, the scratch prefixes (with RECONCILE_SCRATCH) and the registry's room
memberships (with REGISTRY_TABLE; a Scan page at a time, each page decided before the next is read, so memory stays
bounded whatever the table's size).

Every resource ``cleanup.operations.leaks`` lists and maps to a session is freed only when all of these hold:

* its session is not live: the item under the session's key is absent, or past its ``ttl`` by more than
  RECONCILE_GRACE_SECONDS (the write path reads an item past its ttl as gone, and never revives it). The items are
  read with consistent BatchGetItem calls, 100 keys a call;
* it is older than the grace period: a grant's CreationDate (a grant whose date ListGrants does not give is kept),
  the newest object under a prefix, a membership's join time (one without is kept; a membership also waits out
  API Gateway's two-hour cap on a connection). A session's grant is created before its item is written, so the
  grace is what keeps the grant of a session being created: the settings refuse one below
  RECONCILE_GRACE_FLOOR_SECONDS;
* the one rule (``cleanup.core.fence``): right before each RetireGrant, before each page of a prefix's deletion, and
  before each BatchWriteItem of memberships, the item is read again and must still be not live (nor hold the
  membership's connection). A session re-created in between stops it: the resource is kept.

A page's memberships to free are grouped by (session, connection): one fence per group, read again before each of
its BatchWriteItem calls (25 memberships each). Each membership is counted on its own.

The session's item is found by spelling its key from the session id in the deployment's shape
(``leaks.session_key``); a table whose key cannot be spelled so is refused before anything is listed
(``leaks.check_shape``), since under the wrong key every live session would look gone.

Resources that follow no convention are never touched, only counted. With CLEANUP_MODE=dry-run (or the kill switch
turned to a dry run) nothing is freed: the plan is reported. The fence always reads here, whatever RACE_CHECK says:
reconcile has no record of the session, only the item can say it is gone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cleanup.actions import grant, registry, scratch
from cleanup.aws.live_items import BATCH_KEYS
from cleanup.aws.retry import call_with_retry
from cleanup.core.action_api import ActionKind, Gate, Orphan
from cleanup.core.fence import Fence, Reader
from cleanup.deadline import Deadline
from cleanup.exceptions import CleanupError, MissingConfigError, NowHeldError
from cleanup.operations import leaks, liveness
from cleanup.operations.leaks import Found
from cleanup.operations.reconcile_report import KEPT as KEPT
from cleanup.operations.reconcile_report import RESOURCES as RESOURCES
from cleanup.operations.reconcile_report import ReconcileReport as ReconcileReport
from cleanup.operations.reconcile_report import Verdict as Verdict
from cleanup.runtime import Runtime
from cleanup.telemetry import log
from schemas.outcomes import ActionStatus
from schemas.session import Session
from schemas.settings import CleanupMode

GONE_FLOOR = 10
"""A pass with no more resources read as gone than this is never held back by RECONCILE_MAX_GONE_SHARE (a few
leaks among few sessions are the common case of a small deployment)."""
CONNECTION_CAP_SECONDS = 7200
"""API Gateway's longest WebSocket connection: a membership joined longer ago than that (and the grace period) has no
open connection left to post to."""
KINDS: dict[str, type[ActionKind]] = {
    grant.ACTION: grant.Grant,
    scratch.ACTION: scratch.Scratch,
    registry.ACTION: registry.Membership,
}
"""The kind of each resource reconcile frees: how the fence tells whether a live session holds it, and how it is
freed (``ActionKind.free_orphans``)."""


def reconcile(
    runtime: Runtime,
    *,
    now: float | None = None,
    deadline: Deadline | None = None,
    progress: Callable[[int], object] | None = None,
) -> ReconcileReport:
    """List the grants, scratch prefixes and registry memberships, and free those of sessions that are gone (see
    the module's docstring).

    ``progress(n)`` is told of every ``n`` resources decided (a command's progress bar).

    Raises:
        MissingConfigError: SESSION_TABLE, KMS_KEY_ID or SCRATCH_BUCKET is missing, or the table's key is not one
            reconcile can spell from a session id (``leaks.check_shape``).
        TransientError / PermanentError: a listing of grants or prefixes failed (nothing was freed). A failed
            registry scan is reported in ``stopped`` instead: memberships may have been freed before it.
    """
    settings = runtime.settings
    table = settings.session_table
    if not table or not settings.kms_key_id:
        raise MissingConfigError("reconcile needs SESSION_TABLE and KMS_KEY_ID (and SCRATCH_BUCKET)")
    deadline = deadline or Deadline()
    now = time.time() if now is None else now
    key_names = runtime.table_keys(table, deadline)
    leaks.check_shape(settings, key_names)  # before anything is listed: a shape it cannot read frees live grants
    found = [
        *leaks.grants(runtime.clients.kms, leaks.allowed_keys(settings), deadline),
        *(leaks.prefixes(runtime.clients.s3, settings, deadline) if settings.reconcile_scratch else ()),
    ]
    report = ReconcileReport(settings.cleanup_mode.value)
    run = _Run(runtime, table, key_names, now, deadline)
    try:
        _settle(run, found, report, progress)
        if settings.registry_table:
            _memberships(run, settings.registry_table, report, progress)
    finally:
        runtime.metrics.flush()
    return report


def _settle(run: _Run, found: list[Found], report: ReconcileReport, progress: Callable[[int], object] | None) -> None:
    """Decide ``found`` (reads only, BATCH_KEYS at a time), then, unless too many of its sessions read as gone
    (``_Run.held_back``), free what may be freed, and count the verdicts."""
    judged: list[tuple[Verdict | None, dict[str, Any] | None]] = []
    for start in range(0, len(found), BATCH_KEYS):
        judged += run.judge(found[start : start + BATCH_KEYS])
    why = run.held_back(found, judged)
    if why is not None:
        report.stopped = why
        log.error("reconcile: stopped before freeing anything", extra={"why": why})
    for start in range(0, len(found), BATCH_KEYS):
        chunk = found[start : start + BATCH_KEYS]
        verdicts = run.free(chunk, judged[start : start + BATCH_KEYS], held=why is not None)
        for item, verdict in zip(chunk, verdicts, strict=True):
            report.counts[item.resource][verdict] += 1
            _emit(run.runtime, item, verdict)
            if verdict is Verdict.PLANNED:
                report.plan.append(_detail(item))
        if progress is not None:
            progress(len(chunk))


def _memberships(run: _Run, table: str, report: ReconcileReport, progress: Callable[[int], object] | None) -> None:
    """Scan the registry and decide each page before reading the next; a failed scan stops it (``stopped``)."""
    settings, deadline = run.runtime.settings, run.deadline
    names = settings.attributes
    try:
        keys = run.runtime.table_keys(table, deadline)
        where = registry.Registry(table, settings.registry_connection_index, names.registry_connection_id, keys)
        for page in leaks.memberships(run.runtime.clients.dynamodb, where, names, deadline):
            page.sort(key=lambda item: (item.session_id or "", item.ident))  # a group's memberships side by side
            _settle(run, page, report, progress)
    except CleanupError as exc:
        report.stopped = f"the registry scan of {table!r} stopped: {exc}"
        log.warning("reconcile: the registry scan stopped", extra={"table": table, "error": str(exc)})


@dataclass
class _Run:
    runtime: Runtime
    table: str
    key_names: tuple[str, ...]
    now: float
    deadline: Deadline

    def judge(self, chunk: list[Found]) -> list[tuple[Verdict | None, dict[str, Any] | None]]:
        """Each resource's verdict (None: to be freed) and its session's key, reading each session's partition
        (``liveness``) concurrently; nothing is freed."""
        settings = self.runtime.settings
        keys = [
            leaks.session_key(item.session_id, settings, self.key_names) if item.session_id is not None else None
            for item in chunk
        ]
        unique = {leaks.key_text(key): key for key in keys if key is not None}  # one read per session
        looked = dict(zip(unique, self.runtime.executor.map(self._look, unique.values()), strict=True))
        readings = [looked[leaks.key_text(key)] if key is not None else None for key in keys]
        return [(self._verdict(item, reading), key) for item, reading, key in zip(chunk, readings, keys, strict=True)]

    def held_back(self, found: list[Found], judged: list[tuple[Verdict | None, dict[str, Any] | None]]) -> str | None:
        """Why a pass must free nothing: more than RECONCILE_MAX_GONE_SHARE of the resources that name a session (and
        more than GONE_FLOOR) read as gone. A stream path that works leaves few; so many is a table read wrongly
        (another key shape, another table) or an outage, which a person must look at first."""
        candidates = sum(item.session_id is not None for item in found)
        gone = sum(verdict is None for verdict, _ in judged)
        share = self.runtime.settings.reconcile_max_gone_share
        if gone <= GONE_FLOOR or gone <= share * candidates:
            return None
        return (
            f"{gone} of {candidates} resources named by a session read as gone, more than RECONCILE_MAX_GONE_SHARE "
            f"({share:g}): nothing was freed; check SESSION_TABLE, the key settings and the stream path, then run "
            "again (raise RECONCILE_MAX_GONE_SHARE only for a pass known to clean up after an outage)"
        )

    def free(
        self, chunk: list[Found], judged: list[tuple[Verdict | None, dict[str, Any] | None]], *, held: bool
    ) -> list[Verdict]:
        """The final verdicts of ``chunk``: those to be freed are freed, one fence per group (FAILED when ``held``)."""
        groups: dict[tuple[str, ...], list[int]] = {}
        for index, (verdict, _) in enumerate(judged):
            if verdict is None:
                groups.setdefault(_group(chunk[index], index), []).append(index)
        freed: dict[int, Verdict] = {}
        for indices in groups.values():
            key = judged[indices[0]][1]
            assert key is not None  # a resource to free names its session
            verdict = Verdict.FAILED if held else self._free([chunk[index] for index in indices], key)
            freed.update(dict.fromkeys(indices, verdict))
        return [verdict if verdict is not None else freed[index] for index, (verdict, _) in enumerate(judged)]

    def _look(self, key: dict[str, Any] | None) -> liveness.Found | CleanupError | None:
        if key is None:
            return None
        try:
            return self._partition(key, self.deadline)
        except CleanupError as exc:  # the partition could not be read: its resources are kept
            return exc

    def _verdict(self, item: Found, reading: liveness.Found | CleanupError | None) -> Verdict | None:
        """The verdict of ``item``, or None when it is to be freed."""
        if item.session_id is None:
            return Verdict.UNCONVENTIONAL
        if isinstance(reading, CleanupError) or reading is None:
            log.warning("reconcile: the session item could not be read", extra=_detail(item, reading))
            return Verdict.FAILED
        if reading.other or self._alive(reading.session) is not None:
            return Verdict.LIVE
        try:
            young = self._young(item)
        except CleanupError as exc:
            log.warning("reconcile: the age could not be read", extra=_detail(item, exc))
            return Verdict.FAILED
        if young is not None:
            return young
        if self.runtime.settings.cleanup_mode is CleanupMode.DRY_RUN:
            return Verdict.PLANNED
        return None

    def _young(self, item: Found) -> Verdict | None:
        """YOUNG when ``item`` is not older than the grace period (or its age is unknown), GONE for an empty prefix,
        None when it is old enough to free."""
        created = item.created
        if item.where is not None:
            created = leaks.newest(self.runtime.clients.s3, item.where, self.deadline)
            if created is None:
                return Verdict.GONE
        grace = self.runtime.settings.reconcile_grace_seconds
        if item.resource == registry.ACTION:  # API Gateway ends a connection after two hours at most: an older
            grace += CONNECTION_CAP_SECONDS  # membership's connection is closed, whichever session it names
        if created is None or self.now - created <= grace:
            return Verdict.YOUNG
        return None

    def _free(self, items: list[Found], key: dict[str, Any]) -> Verdict:
        """Free ``items`` (one resource, or one group's memberships) behind a fence whose first reading is the one
        the decision was made on."""
        item = items[0]
        fence = Fence(self._reader(key, first=None), self.runtime.settings.fence_read_max_age_seconds)
        fence.reading(self.deadline, None)
        fence.stale()  # the permit reads again, right before the call
        kind = KINDS[item.resource](self.runtime.settings)
        permit = fence.guard(kind, item.ident, item.where)
        try:
            status = call_with_retry(
                lambda: self._act(kind, items, permit), self.runtime.settings, self.deadline, lambda _: fence.stale()
            )
        except NowHeldError as exc:
            log.info("reconcile: kept, the session came back", extra=_detail(item, exc))
            return Verdict.LIVE
        except CleanupError as exc:
            log.warning("reconcile: could not free", extra=_detail(item, exc))
            return Verdict.FAILED
        log.info("reconcile: freed", extra=_detail(item))
        return Verdict.FREED if status is ActionStatus.DONE else Verdict.GONE

    def _act(self, kind: ActionKind, items: list[Found], permit: Gate) -> ActionStatus:
        orphans = [Orphan(found.ident, found.location) for found in items]
        return kind.free_orphans(orphans, permit, self.runtime, self.deadline)

    def _reader(self, key: dict[str, Any], first: Session | None) -> Reader:
        """Reads the session's partition (``liveness``); its first answer is ``first``, the reading the decision was
        made on. Any item under the partition key that is not the session's own keeps the resource."""
        seeded = [first]

        def read(deadline: Deadline, then: str | None) -> tuple[Session | None, float]:
            if seeded:
                return seeded.pop(), time.monotonic()
            found = self._partition(key, deadline)
            if found.other:
                raise NowHeldError("an item lives under the session's partition key: kept")
            return self._alive(found.session), time.monotonic()

        return read

    def _partition(self, key: dict[str, Any], deadline: Deadline) -> liveness.Found:
        settings = self.runtime.settings
        dynamodb, names = self.runtime.clients.dynamodb, settings.attributes
        return liveness.partition(dynamodb, self.table, key, names, deadline, extra=(names.ttl,))

    def _alive(self, session: Session | None) -> Session | None:
        """``session`` if it is live: present, and not past its ttl by more than the grace period."""
        grace = self.runtime.settings.reconcile_grace_seconds
        if session is None or (session.ttl is not None and session.ttl + grace < self.now):
            return None
        return session


def _group(item: Found, index: int) -> tuple[str, ...]:
    """Memberships of one session and connection are freed together; anything else alone."""
    if item.resource == registry.ACTION and item.session_id is not None:
        return (item.resource, item.session_id, item.ident)
    return (item.resource, str(index))


def _emit(runtime: Runtime, item: Found, verdict: Verdict) -> None:
    named = {Verdict.FREED: "ReconcileFreed", Verdict.PLANNED: "ReconcilePlanned", Verdict.FAILED: "ReconcileFailed"}
    name = named.get(verdict, "ReconcileKept" if verdict in KEPT else "ReconcileGone")
    runtime.metrics.count(name, "Resource", item.resource)


def _detail(item: Found, error: BaseException | None = None) -> dict[str, Any]:
    where = {"keyId": item.key_id} if item.key_id else {"bucket": item.where.bucket} if item.where else {}
    if item.membership is not None:
        where = {"membership": "/".join(str(value.get("S", value)) for value in item.membership.values())}
    detail = {"resource": item.resource, "id": item.ident, "sessionId": item.session_id, **where}
    return {**detail, "error": str(error)} if error is not None else detail
