"""The REST API and the Python client: routes, fuzzing, serving, idempotency."""
