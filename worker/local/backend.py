"""An embedded moto server on loopback, and the one thing moto cannot do: delete an item the way TTL does.

moto never expires items and never sets ``userIdentity``. Its server runs in this process, so a TTL delete is
synthesised by deleting through moto's backend and stamping the stream record it produced with DynamoDB's TTL
identity; GetRecords then returns it like a real TTL delete.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from moto.server import ThreadedMotoServer

from cleanup.application_contract import DEFAULT_NAMES
from schemas.convention import membership_item

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeDefinitionTypeDef

DEFAULT_ACCOUNT_ID = "123456789012"  # moto's account
TTL_IDENTITY = {"Type": "Service", "PrincipalId": "dynamodb.amazonaws.com"}
CREDENTIAL_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}

REGISTRY_TTL_SECONDS = 2 * 3600 + 600  # API Gateway's two-hour cap on a connection, and a margin

# Held by every stream write of the embedded server: moto numbers a record by its shard's length and appends it
# with no lock, so two writes at once can get out of order (see serialize_stream_writes), and a TTL delete must
# stamp the record its own delete produced.
_stream_lock = threading.RLock()


class LocalAws:
    """A moto server on 127.0.0.1 and a free port. Use as a context manager or call start()/stop()."""

    def __init__(self, region: str = "us-east-1") -> None:
        self.region = region
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.endpoint_url = ""

    def start(self) -> LocalAws:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request drowns everything else
        serialize_stream_writes()
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> LocalAws:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def environment(self) -> dict[str, str]:
        """The variables that point boto3 (and the worker) at this server."""
        return {
            **CREDENTIAL_ENV,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }

    def use(self) -> None:
        """Point this process's boto3 at the server."""
        os.environ.update(self.environment())

    def expire_by_ttl(self, table: str, key: dict[str, Any]) -> None:
        """Delete ``key`` (an AttributeValue key, e.g. ``{"pk": {"S": "session#1"}}``) as DynamoDB TTL would."""
        expire_by_ttl(table, key, self.region)


def serialize_stream_writes() -> None:
    """Make moto's stream writes one at a time, in this process (idempotent).

    moto's ``StreamShard.add`` takes a record's sequence number from the shard's length and appends afterwards, with
    no lock. The server handles requests in threads, so two writes at once (the demo's sweeper deleting while the
    application writes) can append a higher number before a lower one. GetRecords indexes the shard by sequence
    number, so an iterator then returns the same records again and again, and a poller never reaches the end.
    """
    from moto.dynamodb.models.table import StreamShard

    add = StreamShard.add
    if getattr(add, "serialized", False):
        return

    def serialized_add(self: StreamShard, old: Any, new: Any) -> None:
        with _stream_lock:
            add(self, old, new)

    serialized_add.serialized = True  # type: ignore[attr-defined]
    StreamShard.add = serialized_add  # type: ignore[method-assign]


def create_session_table(
    ddb: DynamoDBClient,
    table: str,
    *,
    view_type: str | None = "NEW_AND_OLD_IMAGES",
    ttl: bool = True,
    expiry_index: str | None = None,
) -> str | None:
    """A session table (``pk``/``sk``) with its stream, TTL on ``ttl``, and optionally the sweeper's expiry index.

    Returns:
        The stream's ARN, or None when ``view_type`` is None (no stream).
    """
    attributes: list[AttributeDefinitionTypeDef] = [
        {"AttributeName": "pk", "AttributeType": "S"},
        {"AttributeName": "sk", "AttributeType": "S"},
    ]
    request: dict[str, Any] = {
        "TableName": table,
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        "BillingMode": "PAY_PER_REQUEST",
    }
    if view_type is not None:
        request["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": view_type}
    if expiry_index is not None:
        attributes += [
            {"AttributeName": "expiryBucket", "AttributeType": "S"},
            {"AttributeName": "ttl", "AttributeType": "N"},
        ]
        request["GlobalSecondaryIndexes"] = [
            {
                "IndexName": expiry_index,
                "KeySchema": [
                    {"AttributeName": "expiryBucket", "KeyType": "HASH"},
                    {"AttributeName": "ttl", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ]
    description = ddb.create_table(AttributeDefinitions=attributes, **request)["TableDescription"]
    if ttl:
        ddb.update_time_to_live(TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"})
    arn = description.get("LatestStreamArn")
    return str(arn) if arn else None


def create_registry_table(ddb: DynamoDBClient, table: str, *, index: str = "byConnection") -> None:
    """A connection registry: one item per (room, connection) membership, ``pk = room#<roomId>#<shard>``,
    ``sk = conn#<connectionId>``, TTL on ``expiresAt``, and the global secondary index ``index`` on ``connectionId``
    (keys only: the table's key and the connection id)."""
    ddb.create_table(
        TableName=table,
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
            {"AttributeName": "connectionId", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": index,
                "KeySchema": [{"AttributeName": "connectionId", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    ddb.update_time_to_live(TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expiresAt"})


def join_room(
    ddb: DynamoDBClient,
    table: str,
    room: str,
    connection_id: str,
    *,
    user_id: str,
    shard: int,
    session_id: str | None = None,
) -> dict[str, Any]:
    """Add ``connection_id`` to ``room`` in the registry, in the room's partition ``shard``; returns the item's key."""
    item = membership(room, connection_id, user_id=user_id, shard=shard, session_id=session_id)
    ddb.put_item(TableName=table, Item=item)
    return {name: item[name] for name in ("pk", "sk")}


def membership(
    room: str, connection_id: str, *, user_id: str, shard: int, session_id: str | None = None
) -> dict[str, Any]:
    """The registry item of one membership (AttributeValue form), expiring a little after API Gateway's cap: the
    write path's convention (``cleanup.application_contract.join_room``) and the user's id; without ``session_id``, a
    membership that names no session."""
    item = membership_item(
        room,
        connection_id,
        session_id,
        shard=shard,
        joined_at=int(time.time()),
        ttl_seconds=REGISTRY_TTL_SECONDS,
        names=DEFAULT_NAMES,
    )
    return {**item, "userId": {"S": user_id}}


def expire_by_ttl(table: str, key: dict[str, Any], region: str, account_id: str = DEFAULT_ACCOUNT_ID) -> None:
    """Delete an item through moto's in-process backend and mark its REMOVE record as a TTL delete."""
    from moto.dynamodb.models import dynamodb_backends

    backend = dynamodb_backends[account_id][region]
    with _stream_lock:
        moto_table = backend.get_table(table)
        shard = moto_table.stream_shard
        before = len(shard.items) if shard is not None else 0
        deleted = backend.delete_item(table, key)
        if deleted is None:
            raise KeyError(f"no item {key} in {table}")
        if shard is None or len(shard.items) != before + 1:
            raise RuntimeError(f"table {table} has no stream: the TTL delete would be invisible")
        shard.items[-1].record["userIdentity"] = dict(TTL_IDENTITY)
