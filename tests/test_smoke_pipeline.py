from worker import lambda_handler


def test_an_explicit_delete_cleans_objects_and_grant(stack):
    item = stack.put_session("a1")
    sentinel = stack.put_session("live", grant=False)
    stack.delete("a1")
    event = stack.lambda_event()

    runtime = stack.runtime()
    lambda_handler._runtime = runtime
    result = lambda_handler.handler(event, None)

    assert result == {"batchItemFailures": []}
    assert stack.objects(item["scratchPrefix"]) == []
    assert len(stack.objects(sentinel["scratchPrefix"])) == 3
    assert item["grantId"] not in stack.grant_ids()
