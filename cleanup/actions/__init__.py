"""The cleanup actions: the connection, the grant, the scratch prefix, and the registry memberships. Each is
idempotent: "already gone" is success, not an error."""
