"""The embedded moto server's stream under concurrent writes: every write once, in sequence-number order, and a TTL
delete stamped on its own record, as DynamoDB Streams would return them."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.stack import SessionStack, client

THREADS = 16
WRITES_EACH = 25


@pytest.fixture
def threads_switch_often() -> Iterator[None]:
    """The server runs in this process: switching threads every microsecond, not every 5 ms, makes two writes meet
    between moto's numbering of a record and its append, where they would meet now and then on a loaded machine."""
    saved = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(saved)


@pytest.mark.usefixtures("threads_switch_often")
def test_concurrent_writes_reach_the_stream_once_each_in_sequence_order(stack: SessionStack) -> None:
    ddb = client("dynamodb", max_pool_connections=THREADS)
    for n in range(THREADS):
        stack.put_session(f"ttl-{n}", objects=0, grant=False)
    stack.new_records()  # past the set-up's writes

    def write(thread: int) -> None:
        for n in range(WRITES_EACH):
            ddb.put_item(
                TableName=stack.table,
                Item={"pk": {"S": f"session#w-{thread}-{n}"}, "sk": {"S": "meta"}},
            )
        stack.expire(f"ttl-{thread}")  # a TTL delete amid the other threads' writes

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(write, range(THREADS)))

    records = stack.new_records()
    keys = [(r["eventName"], r["dynamodb"]["Keys"]["pk"]["S"]) for r in records]
    expected = {("INSERT", f"session#w-{t}-{n}") for t in range(THREADS) for n in range(WRITES_EACH)}
    expected |= {("REMOVE", f"session#ttl-{t}") for t in range(THREADS)}
    assert len(keys) == len(expected)
    assert set(keys) == expected
    sequence = [int(r["dynamodb"]["SequenceNumber"]) for r in records]
    assert sequence == sorted(set(sequence))
    stamped = {key for r, key in zip(records, keys, strict=True) if r.get("userIdentity")}
    assert stamped == {("REMOVE", f"session#ttl-{t}") for t in range(THREADS)}
