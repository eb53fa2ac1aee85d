"""One DeleteObjects for the scratch pages of several sessions of one bucket (fed by a
``cleanup.aws.coalesce.Coalescer``): up to 1,000 keys a call, whoever they belong to.

Each page carries its session's gate: the call's permit is asked where it leaves, after its waits, of every page's
gate at once (one BatchGetItem for the sessions that need a fresh read: ``cleanup.core.fence.permits_together``); a
page whose session keeps it fails alone (``NowHeldError``), and the rest are sent again without it.

Right before the call, every key is checked again to lie under its own session's prefix. Each per-key ``Errors``
entry fails the session whose key it names (and only that one); a call that fails as a whole fails the sessions whose
keys it carried; an answer that does not name a key cannot say it went, and its session is failed transient. Keys
that cannot travel in its XML body unchanged (``xml_safe``) are not sent in it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cleanup.aws.aws_errors import is_transient_code
from cleanup.aws.calls import call
from cleanup.aws.coalesce import Coalescer, Part
from cleanup.aws.permits import Permit, authorized
from cleanup.core.action_api import Gate
from cleanup.core.fence import PartsRefused, permits_together
from cleanup.core.guard import ScratchLocation
from cleanup.deadline import Deadline
from cleanup.exceptions import PermanentError, TransientError, UnsafePrefixError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ErrorTypeDef, ObjectIdentifierTypeDef


@dataclass(frozen=True)
class Page:
    """Listed entries (``Key``, and ``VersionId`` in a versioned bucket) of one session, to delete together; ``last``
    when the listing has no more."""

    where: ScratchLocation
    entries: list[ObjectIdentifierTypeDef]
    last: bool = True
    gate: Gate | None = None
    """Its session's gate: the permit to delete it (None: a page nobody may delete, refused at the send)."""


Deleter = Coalescer[Page, int]
"""Where a session hands its pages to be deleted with other sessions' (one per bucket)."""


_NOT_IN_XML = re.compile("[\x00-\x1f\ufffe\uffff]")


def xml_safe(key: str) -> bool:
    """Whether ``key`` survives DeleteObjects' XML body unchanged (no control character, no XML non-character)."""
    return _NOT_IN_XML.search(key) is None


def delete_pages(s3: S3Client, parts: list[Part[Page, int]], deadline: Deadline) -> None:
    """Delete the pages of ``parts`` (of one bucket, at most 1,000 entries in all) in one DeleteObjects.

    Each part is answered for its own keys: how many it had deleted, or the error of its keys (``Part.fail``). A key
    no longer under its own page's prefix fails its page before anything is sent, and is not sent.

    Raises:
        TransientError / PermanentError: the call failed as a whole (every part it carried failed with it).
    """
    owners: dict[tuple[str, str | None], list[Part[Page, int]]] = {}
    for part in parts:
        try:
            _guard(part.item, parts[0].item.where.bucket)
        except UnsafePrefixError as exc:
            part.fail(exc)
            continue
        for entry in part.item.entries:
            ident = (entry["Key"], entry.get("VersionId"))
            owners.setdefault(ident, []).append(part)
    carried = [part for part in parts if not part.answered]
    for _ in range(len(carried)):  # each round sends, or drops at least one page its session keeps
        if not carried:
            return
        try:
            response = _send(s3, carried, owners, deadline)
        except PartsRefused as refused:
            for part in carried:
                if id(part) in refused.errors:
                    part.fail(refused.errors[id(part)])
            carried = [part for part in carried if not part.answered]
            continue
        _answer(response, carried, owners)
        return


def _send(
    s3: S3Client,
    carried: list[Part[Page, int]],
    owners: dict[tuple[str, str | None], list[Part[Page, int]]],
    deadline: Deadline,
) -> Any:
    objects: list[ObjectIdentifierTypeDef] = []
    for (key, version), whose in owners.items():
        if any(part in carried for part in whose):
            entry: ObjectIdentifierTypeDef = {"Key": key}
            if version is not None:
                entry["VersionId"] = version
            objects.append(entry)
    # Not quiet: an answer names every key, deleted or not, so one that does not (a truncated body read as ``{}``)
    # cannot pass for "all deleted".
    with authorized(_Pages(carried)):
        return call(
            s3.delete_objects,
            "DeleteObjects",
            deadline,
            Bucket=carried[0].item.where.bucket,
            Delete={"Objects": objects, "Quiet": False},
        )


class _Pages:
    """The permit of a DeleteObjects carrying several sessions' pages: each page's gate asked, at once
    (``cleanup.aws.permits.Authority``)."""

    def __init__(self, parts: list[Part[Page, int]]) -> None:
        self._parts = parts

    def authorize(self, deadline: Deadline | None) -> Permit:
        gates = [part.item.gate for part in self._parts]
        deadline = deadline or Deadline()
        if any(gate is None for gate in gates):
            raise PermanentError("a page without its session's gate: nothing is sent")
        given = permits_together([gate for gate in gates if gate is not None], deadline)
        refused = {
            id(part): result
            for part, result in zip(self._parts, given, strict=True)
            if isinstance(result, BaseException)
        }
        if refused:
            raise PartsRefused(refused)
        return Permit.joined(result for result in given if isinstance(result, Permit))


def _answer(
    response: Any, carried: list[Part[Page, int]], owners: dict[tuple[str, str | None], list[Part[Page, int]]]
) -> None:
    errors = _errors_by_part(response.get("Errors", []), owners, carried)
    named = {str(entry.get("Key")) for entry in [*response.get("Deleted", []), *response.get("Errors", [])]}
    for part in carried:
        unnamed = sum(entry["Key"] not in named for entry in part.item.entries)
        if part in errors:
            part.fail(_key_errors(errors[part], len(part.item.entries), part.item.where))
        elif unnamed:
            part.fail(_unanswered(unnamed, len(part.item.entries), part.item.where))
        else:
            part.answer(len(part.item.entries))


def _unanswered(unnamed: int, sent: int, where: ScratchLocation) -> TransientError:
    return TransientError(
        f"DeleteObjects: the answer names {sent - unnamed} of {sent} keys under {where.prefix!r}: cannot tell whether "
        "the rest were deleted; they are listed and sent again"
    )


def _guard(page: Page, bucket: str) -> None:
    """Every key of ``page`` lies under its own session's prefix, in the call's bucket (checked right before it)."""
    if page.where.bucket != bucket or not all(entry["Key"].startswith(page.where.prefix) for entry in page.entries):
        raise UnsafePrefixError(f"a key to delete lies outside {page.where.prefix!r}; nothing more is deleted")


def _errors_by_part(
    errors: list[ErrorTypeDef],
    owners: dict[tuple[str, str | None], list[Part[Page, int]]],
    carried: list[Part[Page, int]],
) -> dict[Part[Page, int], list[ErrorTypeDef]]:
    """Each per-key error, to the part(s) whose key it names: by key and version, else by key. An error naming no key
    sent goes to every part carried, since whose it is cannot be told."""
    by_key: dict[str, list[Part[Page, int]]] = {}
    for (key, _), parts in owners.items():
        by_key.setdefault(key, []).extend(parts)
    found: dict[Part[Page, int], list[ErrorTypeDef]] = {}
    for error in errors:
        key = str(error.get("Key", ""))
        whose = owners.get((key, error.get("VersionId"))) or by_key.get(key) or carried
        for part in dict.fromkeys(whose):
            found.setdefault(part, []).append(error)
    return found


def _key_errors(errors: list[ErrorTypeDef], sent: int, where: ScratchLocation) -> PermanentError | TransientError:
    codes = sorted({str(error.get("Code", "")) for error in errors})
    message = f"DeleteObjects: {len(errors)} of {sent} keys under {where.prefix!r} not deleted ({', '.join(codes)})"
    if all(is_transient_code(code) for code in codes):
        return TransientError(message)
    return PermanentError(message)
