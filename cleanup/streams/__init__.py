"""The stream-consumption engine of the container mode (``cleanup-worker run``).

* ``discovery`` and ``reader``: a table's stream, its shards and their lineage; iterators, and pages read as the
  service sent them; also used by ``capture`` and ``redrive``.
* ``lease``: the one-consumer lease of a stream; ``checkpoints``, ``checkpoint_table`` and ``checkpointing``: the
  per-shard checkpoints, their table, and writing them through its failures.
* ``shard_state`` and ``poller``: each shard's position and batch in flight, and ``StreamPoller``, which runs it all.
* ``follow``: ``StreamFollower``, on to the table's next stream when it changes; ``stream_state``: why the poller
  cannot consume, for its health check.
"""
