"""Delete every object (and, in a versioned bucket, every version and delete marker) under a scratch prefix.

One page is held at a time whatever the prefix's size: list up to 1,000 keys, delete them in one DeleteObjects call,
go on. Every per-key ``Errors`` entry of DeleteObjects is a failure. Versioned buckets are listed again from the start
after each page is deleted (the version markers of a page that no longer exists are not a reliable place to resume),
which also costs no extra call: the loop ends on the first page that is not truncated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from cleanup.aws_errors import is_transient_code, translate
from cleanup.exceptions import PermanentError, TransientError, UnsafePrefixError
from cleanup.guard import ScratchLocation

ACTION = "scratch"
PAGE = 1000  # DeleteObjects' limit


def delete_prefix(s3: Any, where: ScratchLocation, *, versioned: bool) -> dict[str, int]:
    """Delete everything under ``where``; returns how many objects (or versions and markers) were deleted.

    Raises:
        TransientError: throttling, 5xx, network, or per-key errors that are all transient.
        PermanentError: access denied (e.g. object lock) or another per-key error; nothing outside ``where`` is touched.
    """
    pages = _version_pages(s3, where) if versioned else _object_pages(s3, where)
    deleted = 0
    for batch in pages:
        deleted += _delete(s3, where, batch)
    return {"versions" if versioned else "objects": deleted}


def count_prefix(s3: Any, where: ScratchLocation, *, versioned: bool) -> int:
    """How many entries a deletion would remove (read-only; for dry runs)."""
    total = 0
    if versioned:
        for page in _paginate(s3, "list_object_versions", Bucket=where.bucket, Prefix=where.prefix):
            total += len(page.get("Versions", [])) + len(page.get("DeleteMarkers", []))
        return total
    for page in _paginate(s3, "list_objects_v2", Bucket=where.bucket, Prefix=where.prefix):
        total += len(page.get("Contents", []))
    return total


def _paginate(s3: Any, operation: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
    try:
        yield from s3.get_paginator(operation).paginate(**kwargs)
    except (ClientError, BotoCoreError) as exc:
        raise translate(exc, operation) from exc


def _call(what: str, fn: Callable[..., dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    try:
        return fn(**kwargs)
    except (ClientError, BotoCoreError) as exc:
        raise translate(exc, what) from exc


def _object_pages(s3: Any, where: ScratchLocation) -> Iterator[list[dict[str, str]]]:
    start_after: str | None = None
    while True:
        kwargs: dict[str, Any] = {"Bucket": where.bucket, "Prefix": where.prefix, "MaxKeys": PAGE}
        if start_after is not None:
            kwargs["StartAfter"] = start_after
        page = _call("ListObjectsV2", s3.list_objects_v2, **kwargs)
        keys = [{"Key": _inside(item["Key"], where)} for item in page.get("Contents", [])]
        if keys:
            yield keys
            start_after = keys[-1]["Key"]
        if not page.get("IsTruncated") or not keys:
            return


def _version_pages(s3: Any, where: ScratchLocation) -> Iterator[list[dict[str, str]]]:
    while True:
        page = _call(
            "ListObjectVersions", s3.list_object_versions, Bucket=where.bucket, Prefix=where.prefix, MaxKeys=PAGE
        )
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


def _delete(s3: Any, where: ScratchLocation, batch: list[dict[str, str]]) -> int:
    response = _call("DeleteObjects", s3.delete_objects, Bucket=where.bucket, Delete={"Objects": batch, "Quiet": True})
    errors = response.get("Errors", [])
    if not errors:
        return len(batch)
    codes = sorted({str(error.get("Code", "")) for error in errors})
    message = (
        f"DeleteObjects: {len(errors)} of {len(batch)} keys under {where.prefix!r} not deleted ({', '.join(codes)})"
    )
    if all(is_transient_code(code) for code in codes):
        raise TransientError(message)
    raise PermanentError(message)
