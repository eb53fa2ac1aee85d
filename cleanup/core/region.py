"""Global tables: a session is cleaned only by the region that owns it (GLOBAL_TABLE=true).

Every replica's stream carries every REMOVE, so a worker deployed in each region of a global table receives every
session's record. Its fence reads its own replica, consistently, but a strongly consistent read is consistent only
with the writes made in its own region: a session re-created in another region and not yet replicated here looks
absent. So only the region the session lives in may free its resources, and the others skip its record.

Which region that is, the item tells (``home``), each way counting as one vote:

* its socket's API: the region of its ``callbackUrl`` when that is an ``execute-api`` endpoint (a custom domain names
  no region and does not vote);
* its grant's key: the region of its ``kmsKeyId`` ARN;
* a declared attribute (ATTR_HOME_REGION, when set): the region the application wrote there.

The votes must agree. No vote (the item names none of them) or votes for several regions cannot say which region
may clean: the record fails permanently and goes to the dead-letter queue, with what to fix, in every region; nothing
is freed. A session whose region is not this one is skipped (``SessionsElsewhere``), never failed. In its own
region, what the worker itself is configured with must be of that region too: the scratch bucket
(SCRATCH_BUCKET_REGION, declared: one bucket, one region, read by no call), WS_CALLBACK_URL for an item without
``callbackUrl``, KMS_KEY_ID for an item without ``kmsKeyId``. A bucket in another region is shared with it, and no read
of this replica can tell whether a session re-created there uses the same prefix: the record fails permanently.

The check costs no AWS call: this region is the one the worker's clients call, the bucket's is a setting, and the
votes are read from the record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cleanup.core.guard import callback_endpoint, execute_api_region, grant_key
from cleanup.exceptions import BadRecordError, MissingConfigError, PermanentError
from schemas.session import Session
from schemas.settings import KMS_KEY_ARN, REGION_NAME, Settings

if TYPE_CHECKING:
    from cleanup.core.process import Configured


def here(runtime: Configured) -> str | None:
    """The region this worker cleans for (its clients' region) with GLOBAL_TABLE on; None when the check is off.

    Raises:
        MissingConfigError: the clients' region is not a region's name.
    """
    if not runtime.settings.global_table:
        return None
    region = runtime.clients.dynamodb.meta.region_name
    if not region or not REGION_NAME.fullmatch(region):
        raise MissingConfigError(f"GLOBAL_TABLE is on but this worker's region is {region!r}: nothing is cleaned")
    return str(region)


def home(session: Session, image: dict[str, Any], settings: Settings, this: str) -> str:
    """The region that owns ``session`` (see the module's docstring); when it is ``this``, also checks that what the
    worker frees for it lies in ``this`` region.

    Args:
        session: the session of the record's old image.
        image: the old image (AttributeValues), for the declared attribute.
        settings: the worker's settings.
        this: this worker's region.

    Raises:
        BadRecordError: the item tells no region, or several, or a declared region that is none; or, the session
            being this region's, the worker's bucket, endpoint or key for it lies in another.
    """
    votes = _votes(session, image, settings)
    regions = set(votes.values())
    if not regions:
        raise BadRecordError(
            "GLOBAL_TABLE: the item tells no region (no execute-api callbackUrl, no kmsKeyId ARN"
            f"{', no ' + settings.attributes.home_region if settings.attributes.home_region else ''}): which region "
            "may clean it is unknown, nothing is freed; store one of them, or set ATTR_HOME_REGION"
        )
    if len(regions) > 1:
        told = ", ".join(f"{what} in {region}" for what, region in sorted(votes.items()))
        raise BadRecordError(f"GLOBAL_TABLE: the item's resources tell several regions ({told}): nothing is freed")
    (owner,) = regions
    if owner == this:
        _check_own(session, settings, this)
    return owner


def _votes(session: Session, image: dict[str, Any], settings: Settings) -> dict[str, str]:
    """Each region the item itself tells, by what tells it."""
    votes: dict[str, str] = {}
    if session.connection_id and session.callback_url:
        try:
            region = execute_api_region(callback_endpoint(session.callback_url, settings))
        except PermanentError:  # refused: the socket is kept anyway, and tells nothing
            region = None
        if region is not None:
            votes["callbackUrl"] = region
    if session.grant_id and session.kms_key_id:
        try:
            key = grant_key(session.kms_key_id, settings)
        except PermanentError:  # refused: the grant is kept anyway, and tells nothing
            key = None
        if key is not None and KMS_KEY_ARN.fullmatch(key):
            votes["kmsKeyId"] = key.split(":")[3]
    name = settings.attributes.home_region
    if name is not None and name in image:
        declared = image[name].get("S") if isinstance(image[name], dict) else None
        if not isinstance(declared, str) or not REGION_NAME.fullmatch(declared):
            raise BadRecordError(f"GLOBAL_TABLE: {name} is not a region name: {str(image[name])[:80]!r}")
        votes[name] = declared
    return votes


def _check_own(session: Session, settings: Settings, this: str) -> None:
    """What the worker's own settings free for a session of this region lies in this region."""
    elsewhere: list[str] = []
    if session.scratch_prefix is not None and settings.scratch_bucket and settings.scratch_bucket_region != this:
        elsewhere.append(f"SCRATCH_BUCKET_REGION {settings.scratch_bucket_region}")
    if session.connection_id and not session.callback_url and settings.ws_callback_url:
        region = execute_api_region(settings.ws_callback_url)
        if region is not None and region != this:
            elsewhere.append(f"WS_CALLBACK_URL in {region}")
    key = settings.kms_key_id or ""
    key_region = key.split(":")[3] if KMS_KEY_ARN.fullmatch(key) else this  # a bare id or alias: this region's
    if session.grant_id and not session.kms_key_id and key_region != this:
        elsewhere.append(f"KMS_KEY_ID in {key_region}")
    if elsewhere:
        raise BadRecordError(
            f"GLOBAL_TABLE: a session of {this}, but {', '.join(elsewhere)}: a resource shared with another region "
            "cannot be checked against this replica; nothing is freed"
        )
