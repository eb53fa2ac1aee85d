"""Delete every object (and, in a versioned bucket, every version and delete marker) under a scratch prefix.

One page is held at a time whatever the prefix's size: list up to 1,000 keys, delete them, go on. Versioned buckets
are listed again from the start after each page is deleted (the version markers of a page that no longer exists are
not a reliable place to resume), which also costs no extra call: the loop ends on the first page that is not
truncated.

The pages of several sessions of one bucket may go in one DeleteObjects (``cleanup.actions.delete_objects``): up
to 1,000 keys a call, whoever they belong to, each key checked again right before the call.

Keys that cannot travel in DeleteObjects' XML body are deleted one at a time with DeleteObject, where the key is in
the URL: XML 1.0 cannot carry most control characters at all, and parsers turn a carriage return into a line feed,
which would delete another key (or none) and report success. The rest of the page still goes in one call.

The deadline is checked between pages (and ``cleanup.aws.pacing`` bounds each call by it): out of time, the deletion
stops with what it deleted kept, and the record is reported transient so the rest goes on its next delivery.

With SESSION_BINDING, a prefix is deleted only if it is bound to its session (``cleanup.actions.binding.check_bound``,
before anything is listed): exactly its session's folder, ``<root>[<tenant>/]<id>/`` (with ``own``, where the item's
key names an id).

Every page's call asks its permit where it leaves, after its waits (``cleanup.aws.permits``, ``cleanup.core.fence``:
the live item read afresh, after the record's previous destructive call): a session re-created under the same key
while a long prefix was being deleted stops the deletion there (``NowHeldError``), and its data is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from cleanup.actions.binding import check_bound
from cleanup.actions.delete_objects import Deleter, Page, delete_pages, xml_safe
from cleanup.aws.calls import call
from cleanup.aws.coalesce import DELETE, READ, Part
from cleanup.core.action_api import ActionKind, Context, Gate, Holding, Host, Orphan, Step
from cleanup.core.fence import incomparable_prefix
from cleanup.core.guard import ScratchLocation, resolve_prefix, session_id
from cleanup.core.holding import scratch_holding
from cleanup.deadline import Deadline
from cleanup.exceptions import (
    NowHeldError,
    OutOfTimeError,
    PermanentError,
    TransientError,
    UnboundResourceError,
    UnsafePrefixError,
)
from schemas.outcomes import ActionStatus
from schemas.session import Session

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import (
        DeleteObjectRequestTypeDef,
        ListObjectsV2RequestTypeDef,
        ListObjectVersionsRequestTypeDef,
        ObjectIdentifierTypeDef,
    )

__all__ = [
    "ACTION",
    "PAGE",
    "Deleter",
    "Page",
    "Scratch",
    "count_prefix",
    "delete_pages",
    "delete_prefix",
    "xml_safe",
]

ACTION = "scratch"
PAGE = 1000  # DeleteObjects' limit


def delete_prefix(
    s3: S3Client,
    where: ScratchLocation,
    *,
    versioned: bool,
    deadline: Deadline,
    permit: Gate,
    together: Deleter | None = None,
    heading: Callable[[str | None], None] | None = None,
) -> int:
    """Delete everything under ``where``; returns how many objects (or versions and markers) were deleted.

    Pages go through ``together`` when given (one DeleteObjects for several sessions' pages), else one call each. Each
    page's permit is asked of ``permit`` (its gate) where its call leaves (``cleanup.aws.permits``); it refuses with
    ``NowHeldError`` when the prefix may no longer be freed. ``heading`` tells the batch where this thread heads next
    (``cleanup.aws.coalesce``: to a deletion while a page is listed, to its next read once done).

    Raises:
        NowHeldError: ``permit`` keeps the prefix (``deleted``: how much went before).
        OutOfTimeError: the deadline came first; what was deleted stays deleted.
        TransientError: throttling, 5xx, network, or per-key errors that are all transient.
        PermanentError: access denied (e.g. object lock) or another per-key error; nothing outside ``where`` is touched.
    """
    head = heading or (lambda stage: None)
    pages = _version_pages(s3, where, deadline) if versioned else _object_pages(s3, where, deadline)
    deleted = 0
    try:
        head(DELETE)
        for page in pages:
            deleted += _delete(s3, page, deadline, permit, together)
            if deadline.remaining() <= 0:
                raise OutOfTimeError("the deadline came before the next page")
            head(READ if page.last else DELETE)
    except NowHeldError as exc:
        raise NowHeldError(str(exc), deleted) from exc
    except OutOfTimeError as exc:
        raise OutOfTimeError(
            f"{exc}; {deleted} deleted under {where.prefix!r} so far, the rest on the record's next delivery"
        ) from exc
    finally:
        head(READ)
    return deleted


def count_prefix(s3: S3Client, where: ScratchLocation, *, versioned: bool, deadline: Deadline | None = None) -> int:
    """How many entries a deletion would remove (read-only; for dry runs)."""
    # Either listing, paged by its own markers: typed as a mapping, as the request is built for either.
    operation: Callable[..., Mapping[str, Any]] = s3.list_object_versions if versioned else s3.list_objects_v2
    what, kinds = (
        ("ListObjectVersions", ("Versions", "DeleteMarkers")) if versioned else ("ListObjectsV2", ("Contents",))
    )
    request: dict[str, Any] = {"Bucket": where.bucket, "Prefix": where.prefix}
    total = 0
    while True:
        page = _understood(call(operation, what, deadline, **request), where)
        total += sum(len(page.get(kind, [])) for kind in kinds)
        if not page.get("IsTruncated") or not (page.get("NextContinuationToken") or page.get("NextKeyMarker")):
            return total
        if versioned:
            request.update(KeyMarker=page.get("NextKeyMarker"), VersionIdMarker=page.get("NextVersionIdMarker"))
        else:
            request["ContinuationToken"] = page.get("NextContinuationToken")


def _object_pages(s3: S3Client, where: ScratchLocation, deadline: Deadline) -> Iterator[Page]:
    start_after: str | None = None
    while True:
        request: ListObjectsV2RequestTypeDef = {"Bucket": where.bucket, "Prefix": where.prefix, "MaxKeys": PAGE}
        if start_after is not None:
            request["StartAfter"] = start_after
        listed = _understood(call(s3.list_objects_v2, "ListObjectsV2", deadline, **request), where)
        keys: list[ObjectIdentifierTypeDef] = [
            {"Key": _inside(item["Key"], where)} for item in listed.get("Contents", [])
        ]
        last = not listed.get("IsTruncated")
        if keys:
            yield Page(where, keys, last)
            start_after = keys[-1]["Key"]
        if last or not keys:
            return


def _version_pages(s3: S3Client, where: ScratchLocation, deadline: Deadline) -> Iterator[Page]:
    request: ListObjectVersionsRequestTypeDef = {"Bucket": where.bucket, "Prefix": where.prefix, "MaxKeys": PAGE}
    while True:
        listed = _understood(call(s3.list_object_versions, "ListObjectVersions", deadline, **request), where)
        entries: list[ObjectIdentifierTypeDef] = [
            {"Key": _inside(item["Key"], where), "VersionId": item["VersionId"]}
            for item in [*listed.get("Versions", []), *listed.get("DeleteMarkers", [])]
        ]
        last = not listed.get("IsTruncated")
        if entries:
            yield Page(where, entries, last)
        if last or not entries:
            return


L = TypeVar("L", bound=Mapping[str, Any])


def _understood(listed: L, where: ScratchLocation) -> L:
    """A listing that names its bucket; one that does not (an empty or truncated body, read as ``{}``) cannot say
    the prefix is empty, and must not end a deletion as done."""
    if listed.get("Name") != where.bucket:
        raise TransientError(f"a listing of {where.prefix!r} that does not name its bucket: cannot tell what is left")
    return listed


def _inside(key: str, where: ScratchLocation) -> str:
    # S3 only lists keys under the prefix; this holds even if a proxy or a bug says otherwise.
    if not key.startswith(where.prefix):
        raise UnsafePrefixError(f"listing returned a key outside {where.prefix!r}; nothing more is deleted")
    return key


def _delete(s3: S3Client, page: Page, deadline: Deadline, gate: Gate, together: Deleter | None) -> int:
    safe = Page(page.where, [], page.last, gate)
    alone: list[ObjectIdentifierTypeDef] = []
    for entry in page.entries:
        (safe.entries if xml_safe(entry["Key"]) else alone).append(entry)
    if safe.entries:
        if together is not None:
            # Done with this prefix once answered: the thread's next stage is its next record's read.
            together.submit(safe, len(safe.entries), deadline, then=READ)
        else:
            part: Part[Page, int] = Part(safe, len(safe.entries), deadline)
            delete_pages(s3, [part], deadline)
            if part.error is not None:
                raise part.error
    for entry in alone:
        request: DeleteObjectRequestTypeDef = {"Bucket": page.where.bucket, "Key": entry["Key"]}
        if "VersionId" in entry:
            request["VersionId"] = entry["VersionId"]
        with gate.sending(deadline):
            call(s3.delete_object, "DeleteObject", deadline, **request)
    return len(page.entries)


class Scratch(ActionKind):
    """The session's scratch data (``ATTR_SCRATCH_PREFIX``, in SCRATCH_BUCKET or an ``s3://`` URI)."""

    name = ACTION
    owns = ("scratch_prefix",)
    reads = ("pk", "tenant_id")
    paced_by = "s3"
    phase = 0

    def plan(self, session: Session, context: Context) -> Sequence[Step]:
        if session.scratch_prefix is None:  # an empty prefix is refused by the guard, not ignored
            return []
        scratch_prefix, runtime, calls = session.scratch_prefix, context.runtime, context.calls
        try:
            where = resolve_prefix(scratch_prefix, runtime.settings, session.tenant_id)
            binding = runtime.settings.session_binding
            sid = session_id(session.pk, runtime.settings)
            check_bound(where, sid, binding, runtime.settings, session.tenant_id)
        except PermanentError as exc:
            detail = {"prefix": scratch_prefix, **({"unbound": True} if isinstance(exc, UnboundResourceError) else {})}
            return [self.step(scratch_prefix, detail, refusal=exc)]
        gate = self.gate(context, scratch_prefix, where, then=DELETE)

        def run(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
            versioned = runtime.is_versioned(where.bucket, deadline)
            together = calls.deleter(where.bucket) if calls is not None else None
            try:
                deleted = delete_prefix(
                    runtime.clients.s3,
                    where,
                    versioned=versioned,
                    deadline=deadline,
                    permit=gate,
                    together=together,
                    heading=calls.head if calls is not None else None,
                )
            except NowHeldError as held:
                return ActionStatus.KEPT, {"heldBy": "live session", _unit(versioned): held.deleted}
            return (ActionStatus.DONE if deleted else ActionStatus.ALREADY_DONE), {_unit(versioned): deleted}

        def preview(deadline: Deadline) -> tuple[ActionStatus, dict[str, Any]]:
            versioned = runtime.is_versioned(where.bucket, deadline)
            found = count_prefix(runtime.clients.s3, where, versioned=versioned, deadline=deadline)
            return ActionStatus.PLANNED, {_unit(versioned): found}

        detail = {"bucket": where.bucket, "prefix": where.prefix}
        return [self.step(scratch_prefix, detail, run=run, preview=preview, location=where)]

    def free_orphans(self, orphans: Sequence[Orphan], gate: Gate, host: Host, deadline: Deadline) -> ActionStatus:
        [orphan] = orphans
        where = orphan.location
        if not isinstance(where, ScratchLocation):
            raise PermanentError(f"scratch {orphan.resource!r}: no bucket and prefix to delete")
        versioned = host.is_versioned(where.bucket, deadline)
        deleted = delete_prefix(host.clients.s3, where, versioned=versioned, deadline=deadline, permit=gate)
        return ActionStatus.DONE if deleted else ActionStatus.ALREADY_DONE

    def holding(self, resource: str, live: Session, location: Any) -> Holding:
        if live.scratch_prefix is None or not isinstance(location, ScratchLocation):
            return Holding.FREE
        return scratch_holding(location, live.scratch_prefix, self.settings.scratch_bucket or "")

    def unknown(self, resource: str, live: Session) -> PermanentError:
        return incomparable_prefix(resource, live.scratch_prefix)

    def covering(self, resource: str, location: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if not isinstance(location, ScratchLocation):
            return (), ()
        return (), (f"s3:{location.bucket}/{location.prefix}",)


def _unit(versioned: bool) -> str:
    return "versions" if versioned else "objects"
