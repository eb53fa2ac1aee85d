"""The durable queues: the backlog and its drain, the dead letters, and the integrity of the messages."""
