"""Closing a runtime waits for the records still being cleaned, and they can still reach the side pool meanwhile."""

from __future__ import annotations

import threading
import time

import pytest

from tests.stack import SessionStack

pytestmark = pytest.mark.timeout(60)


def test_close_waits_for_a_record_that_takes_the_side_pool_while_it_closes(stack: SessionStack) -> None:
    # A record still running when the runtime is closed (a test's end, a container stopping) starts its grant's name
    # check on the side pool: close must not hold the runtime's lock while it waits for that record.
    runtime = stack.runtime()
    closing = threading.Event()

    def record() -> int:
        closing.wait(10.0)
        time.sleep(0.3)  # close is waiting for this record by now
        return int(runtime.side_executor.submit(lambda: 7).result(timeout=10.0))

    running = runtime.executor.submit(record)
    closer = threading.Thread(target=runtime.close, daemon=True)
    closing.set()
    closer.start()
    closer.join(20.0)

    assert not closer.is_alive()
    assert running.result(timeout=1.0) == 7
