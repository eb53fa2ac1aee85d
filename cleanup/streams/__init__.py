"""The stream-consumption engine of the container mode (``cleanup-worker run``).

* ``reader``: a DynamoDB stream's shards and their lineage, iterators, and pages read as the service sent them;
  also used by ``capture`` and ``redrive``.
* ``lease``: the one-consumer lease of a stream; ``checkpoints``, ``checkpoint_table`` and ``checkpointing``: the
  per-shard checkpoints, their table, and writing them through its failures.
* ``shard_state`` and ``poller``: each shard's position and batch in flight, and ``StreamPoller``, which runs it all.
"""
