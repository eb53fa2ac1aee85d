"""Delete every object (and, in a versioned bucket, every version and delete marker) under a scratch prefix.

One page is held at a time whatever the prefix's size: list up to 1,000 keys, delete them, go on. Every per-key
``Errors`` entry of DeleteObjects is a failure. Versioned buckets are listed again from the start after each page is
deleted (the version markers of a page that no longer exists are not a reliable place to resume), which also costs no
extra call: the loop ends on the first page that is not truncated.

Keys that cannot travel in DeleteObjects' XML body are deleted one at a time with DeleteObject, where the key is in
the URL: XML 1.0 cannot carry most control characters at all, and parsers turn a carriage return into a line feed,
which would delete another key (or none) and report success. The rest of the page still goes in one call.

The deadline is checked between pages (and ``cleanup.pacing`` bounds each call by it): out of time, the deletion
stops with what it deleted kept, and the record is reported transient so the rest goes on its next delivery.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cleanup.aws_errors import is_transient_code
from cleanup.calls import call
from cleanup.exceptions import OutOfTimeError, PermanentError, TransientError, UnsafePrefixError
from cleanup.guard import ScratchLocation
from cleanup.retry import Deadline

ACTION = "scratch"
PAGE = 1000  # DeleteObjects' limit


def delete_prefix(s3: Any, where: ScratchLocation, *, versioned: bool, deadline: Deadline | None = None) -> int:
    """Delete everything under ``where``; returns how many objects (or versions and markers) were deleted.

    Raises:
        OutOfTimeError: the deadline came first; what was deleted stays deleted.
        TransientError: throttling, 5xx, network, or per-key errors that are all transient.
        PermanentError: access denied (e.g. object lock) or another per-key error; nothing outside ``where`` is touched.
    """
    deadline = deadline or Deadline()
    deleted = 0
    try:
        for batch in _version_pages(s3, where, deadline) if versioned else _object_pages(s3, where, deadline):
            deleted += _delete(s3, where, batch, deadline)
            if deadline.remaining() <= 0:
                raise OutOfTimeError("the deadline came before the next page")
    except OutOfTimeError as exc:
        raise OutOfTimeError(
            f"{exc}; {deleted} deleted under {where.prefix!r} so far, the rest on the record's next delivery"
        ) from exc
    return deleted


def count_prefix(s3: Any, where: ScratchLocation, *, versioned: bool, deadline: Deadline | None = None) -> int:
    """How many entries a deletion would remove (read-only; for dry runs)."""
    operation, what, kinds = (
        (s3.list_object_versions, "ListObjectVersions", ("Versions", "DeleteMarkers"))
        if versioned
        else (s3.list_objects_v2, "ListObjectsV2", ("Contents",))
    )
    request: dict[str, Any] = {"Bucket": where.bucket, "Prefix": where.prefix}
    total = 0
    while True:
        page = call(operation, what, deadline, **request)
        total += sum(len(page.get(kind, [])) for kind in kinds)
        if not page.get("IsTruncated") or not (page.get("NextContinuationToken") or page.get("NextKeyMarker")):
            return total
        if versioned:
            request.update(KeyMarker=page.get("NextKeyMarker"), VersionIdMarker=page.get("NextVersionIdMarker"))
        else:
            request["ContinuationToken"] = page.get("NextContinuationToken")


def _object_pages(s3: Any, where: ScratchLocation, deadline: Deadline) -> Iterator[list[dict[str, str]]]:
    start_after: str | None = None
    while True:
        request: dict[str, Any] = {"Bucket": where.bucket, "Prefix": where.prefix, "MaxKeys": PAGE}
        if start_after is not None:
            request["StartAfter"] = start_after
        page = call(s3.list_objects_v2, "ListObjectsV2", deadline, **request)
        keys = [{"Key": _inside(item["Key"], where)} for item in page.get("Contents", [])]
        if keys:
            yield keys
            start_after = keys[-1]["Key"]
        if not page.get("IsTruncated") or not keys:
            return


def _version_pages(s3: Any, where: ScratchLocation, deadline: Deadline) -> Iterator[list[dict[str, str]]]:
    request: dict[str, Any] = {"Bucket": where.bucket, "Prefix": where.prefix, "MaxKeys": PAGE}
    while True:
        page = call(s3.list_object_versions, "ListObjectVersions", deadline, **request)
        entries = [
            {"Key": _inside(item["Key"], where), "VersionId": item["VersionId"]}
            for kind in ("Versions", "DeleteMarkers")
            for item in page.get(kind, [])
        ]
        if entries:
            yield entries
        if not page.get("IsTruncated") or not entries:
            return


def _inside(key: str, where: ScratchLocation) -> str:
    # S3 only lists keys under the prefix; this holds even if a proxy or a bug says otherwise.
    if not key.startswith(where.prefix):
        raise UnsafePrefixError(f"listing returned a key outside {where.prefix!r}; nothing more is deleted")
    return key


def xml_safe(key: str) -> bool:
    """Whether ``key`` survives DeleteObjects' XML body unchanged (no control character, no XML non-character)."""
    return not any(ord(char) < 0x20 or char in "\ufffe\uffff" for char in key)


def _delete(s3: Any, where: ScratchLocation, batch: list[dict[str, str]], deadline: Deadline) -> int:
    together = [entry for entry in batch if xml_safe(entry["Key"])]
    alone = [entry for entry in batch if not xml_safe(entry["Key"])]
    if together:
        response = call(
            s3.delete_objects,
            "DeleteObjects",
            deadline,
            Bucket=where.bucket,
            Delete={"Objects": together, "Quiet": True},
        )
        _raise_key_errors(response.get("Errors", []), len(together), where)
    for entry in alone:
        call(s3.delete_object, "DeleteObject", deadline, Bucket=where.bucket, **entry)
    return len(batch)


def _raise_key_errors(errors: list[dict[str, Any]], sent: int, where: ScratchLocation) -> None:
    if not errors:
        return
    codes = sorted({str(error.get("Code", "")) for error in errors})
    message = f"DeleteObjects: {len(errors)} of {sent} keys under {where.prefix!r} not deleted ({', '.join(codes)})"
    if all(is_transient_code(code) for code in codes):
        raise TransientError(message)
    raise PermanentError(message)
