"""Expiry on time: the write-path helpers that give a session its ttl and expiry bucket (``write_path``), and the
sweeper that deletes the sessions whose ttl has passed (``sweeper``), instead of waiting for DynamoDB TTL."""
