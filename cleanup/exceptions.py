"""The worker's errors, all in one tree.

botocore's errors are translated into these where the worker makes a call (``cleanup.aws.calls.call``, through
``cleanup.aws.aws_errors.translate``); the few callers that must read an error code themselves (a checkpoint that lost
its lease, a sweep's conditional delete) translate the rest the same way.

::

    CleanupError                      anything an action or the pipeline raises on purpose
    ├── TransientError                retry with backoff; report the record failed if retries run out
    │     │ (throttling, 5xx, timeouts, connection resets, S3 per-key InternalError/SlowDown)
    │     ├── ThrottledError          the service refused the request for its rate: nothing was done; tried again
    │     │                           within the deadline, more often than other transient errors
    │     ├── OutOfTimeError          the deadline leaves no time for the call (or its next try): nothing is lost,
    │     │                           the record is reported and cleaned on its next delivery
    │     ├── IteratorExpiredError    a shard iterator past its 15 minutes: open a new one where reading stopped
    │     ├── TrimmedDataError        a stream position older than the 24 h retention: records were lost
    │     └── PausedError             the kill switch pauses cleanup: the batch is left in the stream, untouched
    └── PermanentError                retrying cannot help: dead-letter it, or report it failed
          ├── AccessDeniedError       the role may not make this call (the message names it)
          ├── ConditionFailedError    a conditional write found the item otherwise (``item``: what is there now)
          ├── UnsafePrefixError       the guard refused a scratch prefix (nothing was deleted)
          ├── RefusedEndpointError    an item's callbackUrl is not an allowed management endpoint (nothing was sent)
          ├── RefusedKeyError         an item's kmsKeyId is not a key the worker may retire grants on (nothing was sent)
          ├── RefusedConnectionError  an item's connection attribute does not match CONNECTION_ID_PATTERN (nothing sent)
          ├── UnboundResourceError    SESSION_BINDING: a grant or prefix that is not bound to the item's session (kept)
          ├── MissingConfigError      a resource with no way to reach it (grant without key, socket without endpoint)
          ├── BadRecordError          the record or its image cannot be decoded (names the attribute)
          ├── SessionExistsError      write path: creating a session whose key is taken (its resources would leak)
          ├── CheckpointTableError    the checkpoint table refused a call (a missing permission...): the consumer stops
          ├── StreamNotFoundError     the table has no stream, or the stream (or shard) no longer exists
          ├── MessageFormatError      redrive: a message that is neither an on-failure nor a dead-letter message
          ├── IntegrityError          a dead-letter or backlog message (or its stored record) whose integrity tag
          │                           is missing or wrong: the worker cannot vouch for it, and frees nothing
          └── SourceFileError         replay: a file that is missing, not JSON, or of no known shape
    NowHeldError                      the fence keeps a resource: a live session under the same key holds it, or the
                                      session was re-created while being cleaned (the step is "kept", not failed)
    LeaseLostError                    another consumer owns the stream now: stop reading and checkpointing at once
    StopRequested                     the consumer was asked to stop while it waited on a failing dependency
    ConfigurationError                a setting in the environment is invalid: nothing runs until it is fixed

    Raised by ``schemas`` (the data layer, which imports nothing of ``cleanup``), and turned into the above where a
    record is read:
    ValueError
    ├── AttributeDecodeError          an AttributeValue DynamoDB could not have produced (names its path)
    ├── SessionItemError              a session attribute of the wrong type
    └── RecordError                   a record that is not a stream record (with its sequence number when known)

"Already done" is not an error: a 410 GoneException, a grant that is not found, or an empty prefix are successes,
returned as ``ActionStatus.ALREADY_DONE`` by the action itself.
"""

from __future__ import annotations

from typing import Any


class CleanupError(Exception):
    """Base of the worker's own errors."""


class TransientError(CleanupError):
    """May succeed if tried again later."""


class PermanentError(CleanupError):
    """Will fail again however often it is tried; needs a person or a fix."""


class AccessDeniedError(PermanentError):
    """The worker's role is not allowed to make the call."""


class ConditionFailedError(PermanentError):
    """A conditional write (or a transaction's condition) did not hold: the item is not as the writer expected.

    ``item`` is the item as it is now, when the call asked for it (``ReturnValuesOnConditionCheckFailure``).
    """

    def __init__(self, message: str, item: Any = None) -> None:
        super().__init__(message)
        self.item = item


class NowHeldError(CleanupError):
    """The fence (``cleanup.core.fence``) keeps a resource: the live item under the same key holds it, or the session
    was re-created while it was being cleaned. The step is "kept", not failed.

    ``deleted``: what the step deleted before (the old session's own data, read as free before each call)."""

    def __init__(self, message: str, deleted: int = 0) -> None:
        super().__init__(message)
        self.deleted = deleted


class UnsafePrefixError(PermanentError):
    """The scratch prefix is outside what the worker may delete."""


class RefusedEndpointError(PermanentError):
    """The item names a callback endpoint the worker may not send signed requests to."""


class RefusedKeyError(PermanentError):
    """The item names a KMS key that is neither KMS_KEY_ID nor in ALLOWED_KMS_KEY_IDS: its grant is kept."""


class RefusedConnectionError(PermanentError):
    """The item's connection attribute does not match CONNECTION_ID_PATTERN: no connection id can be read from it."""


class UnboundResourceError(PermanentError):
    """SESSION_BINDING: the item names a grant or scratch prefix that is not bound to its own session (a grant not
    named ``session:<id>``, a prefix not ending in ``<id>/``): it is kept."""


class MissingConfigError(PermanentError):
    """A resource the worker cannot address with the configuration it has."""


class BadRecordError(PermanentError):
    """A record that cannot be decoded or is not what the stream should carry."""


class SessionExistsError(PermanentError):
    """A session item already holds this key; overwriting it would leave its resources uncleaned."""


class ThrottledError(TransientError):
    """The service refused the request for its rate (a quota): nothing was done, and trying again later may pass."""


class OutOfTimeError(TransientError):
    """The caller's deadline (a Lambda invocation's end) leaves no time to start a call, or to try it again."""


class CheckpointTableError(PermanentError):
    """The checkpoint table cannot be used (access denied, another shape): no consumer can run until it is fixed."""


class IteratorExpiredError(TransientError):
    """A shard iterator expired (ExpiredIteratorException): open a new one where reading stopped."""


class TrimmedDataError(TransientError):
    """A stream position is past the stream's retention (TrimmedDataAccessException)."""


class PausedError(TransientError):
    """The kill switch pauses cleanup: nothing of the batch was done, and its records must be delivered again."""


class StreamNotFoundError(PermanentError):
    """A table without a stream, or a stream or shard that no longer exists."""


class MessageFormatError(PermanentError):
    """A message that is neither an on-failure destination message nor a dead-letter message."""


class IntegrityError(PermanentError):
    """A message the worker says it wrote, but cannot vouch for: its integrity tag is missing or does not verify, or
    its stored record is not the one the tag covers. Nothing it names is freed; it is counted and kept."""


class SourceFileError(PermanentError):
    """A file that cannot be read at all: missing, not JSON, or of no known shape."""


class LeaseLostError(Exception):
    """The consumer lease of a stream is held by another consumer (not a record's error: it stops the consumer)."""


class StopRequested(Exception):
    """Asked to stop while a dependency (the checkpoint table) was still failing."""


class ConfigurationError(Exception):
    """Invalid settings in the environment (not a record's error: the process cannot start).

    ``problems`` maps each bad environment variable to why; ``str()`` is one line naming them all.
    """

    def __init__(self, problems: dict[str, str]) -> None:
        self.problems = dict(problems)
        super().__init__("configuration error: " + "; ".join(f"{name}: {why}" for name, why in self.problems.items()))
