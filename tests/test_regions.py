"""A worker per region on a global table: a session is cleaned only by the region that owns its resources.

moto has no replication, but its server answers for every region: a client's ``region_name`` picks the region's
backend (S3 excepted: one namespace of buckets). The session lives in us-east-1 (the test stack); eu-west-1 holds a
replica of the table that has not caught up, as a replica lags the region a user just came back to. Every replica's
stream carries every REMOVE, so the same record is handed to a worker in each region.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.session
import pytest

from cleanup.aws.clients import Clients
from cleanup.queues.reporting import run_batch
from cleanup.runtime import Runtime
from cleanup.telemetry import Metrics, MetricsSink
from schemas.outcomes import Status
from schemas.records import read_lambda_event
from tests.stack import REGION, SessionStack
from worker.local.backend import create_session_table

EU = "eu-west-1"
HOME_ATTRIBUTE = "homeRegion"


class Worker:
    """A worker whose clients call ``region``, its metrics kept, and the AWS operations it sent counted."""

    def __init__(self, stack: SessionStack, region: str, **overrides: Any) -> None:
        settings = stack.settings(
            **{"global_table": True, "scratch_bucket_region": REGION, "scratch_tenant_scoped": True, **overrides}
        )
        session = botocore.session.get_session()
        session.set_config_variable("region", region)
        self.calls: Counter[str] = Counter()
        self.consistent: list[tuple[str, bool]] = []
        session.register("before-parameter-build", self._count)
        self.emitted = io.StringIO()
        metrics = Metrics(settings, MetricsSink("stdout", stream=self.emitted))
        self.runtime = Runtime(settings, Clients(settings, session), metrics)

    def _count(self, model: Any, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        self.calls[model.name] += 1
        if model.name == "BatchGetItem":
            for request in params.get("RequestItems", {}).values():
                self.consistent.append((context["client_region"], request.get("ConsistentRead") is True))

    def metric(self, name: str) -> float:
        """The total of ``name`` over the EMF documents emitted."""
        total = 0.0
        for line in self.emitted.getvalue().splitlines():
            document = json.loads(line)
            if name in document:
                total += document[name]
        return total


@pytest.fixture
def stack(stack: SessionStack) -> Iterator[SessionStack]:
    """The test stack (us-east-1), and the same table in eu-west-1: a replica that has not caught up."""
    replica = boto3.client("dynamodb", region_name=EU)
    create_session_table(replica, stack.table)
    yield stack
    replica.delete_table(TableName=stack.table)


def ended(stack: SessionStack, session_id: str, **extra: Any) -> tuple[list[Any], dict[str, Any]]:
    """A session of us-east-1, ended: the REMOVE every replica's stream carries, and the item it had."""
    item = stack.put_session(session_id, extra=extra)
    stack.delete(session_id)
    removes = [record for record in stack.new_records() if record["eventName"] == "REMOVE"]
    return read_lambda_event(stack.lambda_event(removes)), item


def untouched(stack: SessionStack, item: dict[str, Any]) -> bool:
    return item["grantId"] in stack.grant_ids() and len(stack.objects(item["scratchPrefix"])) == 3


def cleaned(stack: SessionStack, item: dict[str, Any]) -> bool:
    return item["grantId"] not in stack.grant_ids() and stack.objects(item["scratchPrefix"]) == []


HOME_API = f"https://abc123defg.execute-api.{REGION}.amazonaws.com/prod"


@pytest.fixture(params=["key ARN", "declared attribute", "callback URL"])
def told(request: pytest.FixtureRequest, stack: SessionStack) -> dict[str, Any]:
    """Ways an item tells its session's region: its key's ARN, a declared attribute, its socket's endpoint."""
    return {
        "key ARN": {"kmsKeyId": stack.key_arn},
        "declared attribute": {HOME_ATTRIBUTE: REGION},
        "callback URL": {"connectionId": "c-1", "callbackUrl": HOME_API},
    }[request.param]


def test_a_record_arriving_in_the_other_region_frees_nothing(stack: SessionStack, told: dict[str, Any]) -> None:
    records, item = ended(stack, "s-1", **told)
    # Each region's worker allows the other regions' APIs: an endpoint it refuses tells no region.
    elsewhere = Worker(stack, EU, attributes={"home_region": HOME_ATTRIBUTE}, allowed_callback_urls=HOME_API)

    [outcome] = run_batch(records, elsewhere.runtime)

    assert untouched(stack, item)
    assert outcome.status is Status.SKIPPED and REGION in (outcome.skip_reason or "")
    assert elsewhere.metric("SessionsElsewhere") == 1
    assert elsewhere.calls == Counter()  # not even a read: nothing of this region's is at stake


@pytest.mark.parametrize("extra", [{"kmsKeyId": "key"}, {HOME_ATTRIBUTE: REGION}])
def test_in_its_home_region_it_is_cleaned_on_a_consistent_read_of_that_region(
    stack: SessionStack, extra: dict[str, Any]
) -> None:
    extra = {"kmsKeyId": stack.key_arn} if "kmsKeyId" in extra else extra
    records, item = ended(stack, "s-1", **extra)
    home = Worker(stack, REGION, attributes={"home_region": HOME_ATTRIBUTE})

    [outcome] = run_batch(records, home.runtime)

    assert outcome.status is Status.CLEANED
    assert cleaned(stack, item)
    assert home.consistent and all(read == (REGION, True) for read in home.consistent)
    assert home.metric("SessionsElsewhere") == 0


def test_the_check_adds_no_call(stack: SessionStack) -> None:
    checked = Worker(stack, REGION)
    unchecked = Worker(stack, REGION, global_table=False, scratch_bucket_region=None)
    records_a, a = ended(stack, "a-1", kmsKeyId=stack.key_arn)
    run_batch(records_a, checked.runtime)
    records_b, b = ended(stack, "b-1", kmsKeyId=stack.key_arn)
    run_batch(records_b, unchecked.runtime)

    assert cleaned(stack, a) and cleaned(stack, b)
    assert checked.calls == unchecked.calls


def test_a_session_that_tells_no_region_is_kept_and_reported(stack: SessionStack) -> None:
    records, item = ended(stack, "s-1")  # no key ARN, no callback URL, no declared region
    home = Worker(stack, REGION, attributes={"home_region": HOME_ATTRIBUTE})

    [outcome] = run_batch(records, home.runtime)

    assert untouched(stack, item)
    assert outcome.status is Status.FAILED and outcome.permanent
    assert "region" in (outcome.error or "")


def test_resources_that_tell_different_regions_are_kept_and_reported(stack: SessionStack) -> None:
    records, item = ended(stack, "s-1", kmsKeyId=stack.key_arn, **{HOME_ATTRIBUTE: EU})
    home = Worker(stack, REGION, attributes={"home_region": HOME_ATTRIBUTE})

    [outcome] = run_batch(records, home.runtime)

    assert untouched(stack, item)
    assert outcome.status is Status.FAILED and outcome.permanent


def test_a_home_session_whose_bucket_is_in_another_region_is_kept_and_reported(stack: SessionStack) -> None:
    # A bucket shared by the regions: a session re-created in another region could be using the same prefix, and no
    # read of this region's replica can tell.
    records, item = ended(stack, "s-1", kmsKeyId=stack.key_arn)
    home = Worker(stack, REGION, scratch_bucket_region=EU)

    [outcome] = run_batch(records, home.runtime)

    assert untouched(stack, item)
    assert outcome.status is Status.FAILED and outcome.permanent
    assert "SCRATCH_BUCKET_REGION" in (outcome.error or "")


def test_a_declared_region_that_is_no_region_is_reported(stack: SessionStack) -> None:
    records, item = ended(stack, "s-1", kmsKeyId=stack.key_arn, **{HOME_ATTRIBUTE: "us-east-1; drop"})
    home = Worker(stack, REGION, attributes={"home_region": HOME_ATTRIBUTE})

    [outcome] = run_batch(records, home.runtime)

    assert untouched(stack, item)
    assert outcome.status is Status.FAILED and outcome.permanent


def test_the_settings_refuse_a_check_they_could_not_make(stack: SessionStack) -> None:
    with pytest.raises(ValueError, match="SCRATCH_BUCKET_REGION"):
        stack.settings(global_table=True)
    with pytest.raises(ValueError, match="GLOBAL_TABLE"):
        stack.settings(attributes={"home_region": HOME_ATTRIBUTE})
    with pytest.raises(ValueError, match="SCRATCH_BUCKET_REGION"):
        stack.settings(global_table=True, scratch_bucket_region="Mars")
