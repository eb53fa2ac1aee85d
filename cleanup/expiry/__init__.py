"""Expiry on time: the sweeper that deletes the sessions whose ttl has passed (``sweeper``), instead of waiting for
DynamoDB TTL. The ttl and expiry bucket it relies on are written by the applications' side of the contract
(``cleanup.application_contract``)."""
