"""The three cleanup actions. Each is idempotent: "already gone" is success, not an error."""
