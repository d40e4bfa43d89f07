"""The store's error model (spec 000 §11).

Callers branch on the class: an executor retries after ``VersionConflict`` by re-reading,
gives up on ``LockLost``, and the API maps every class to one HTTP status
(``http_status``). Every error leaves the database unchanged: it is raised inside the
operation's transaction, which then rolls back.
"""

from __future__ import annotations

EXCERPT_CHARS = 60


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """A bounded, printable rendering of user input for error messages: a 100 KB id must
    not become a 100 KB error. Control characters and lone surrogates are escaped."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = text[:limit] + f"… ({len(text)} characters)"
    return text.encode("unicode_escape", "backslashreplace").decode("ascii") if not text.isprintable() else text


class StoreError(Exception):
    """Base class: ``code`` is a stable, machine-readable name for API bodies."""

    code = "store_error"
    http_status = 500

    def __init__(self, message: str = ""):
        super().__init__(message or self.__class__.__doc__.strip().splitlines()[0])

    @property
    def message(self) -> str:
        return str(self)

    def as_dict(self) -> dict:
        return {"error": self.code, "message": self.message}


class NotFound(StoreError):
    """The execution (or event, delay, response) does not exist."""

    code = "not_found"
    http_status = 404


class ValidationFailed(StoreError):
    """The request is malformed: bad ids, bad arguments, impossible times."""

    code = "validation_failed"
    http_status = 400


class UnsupportedValue(ValidationFailed):
    """A value cannot be stored: not JSON, a NUL character, nested too deeply, or text that is not valid Unicode."""

    code = "unsupported_value"


class InvalidId(ValidationFailed):
    """An identifier does not follow Obelisk's format."""

    code = "invalid_id"


class PayloadTooLarge(ValidationFailed):
    """A JSON payload (parameters, return value, event) is larger than allowed."""

    code = "payload_too_large"
    http_status = 413

    def __init__(self, what: str, size: int, limit: int):
        super().__init__(f"{what} is {size} bytes of JSON, more than the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class Conflict(StoreError):
    """The write collides with existing data (duplicate id with other content, duplicate response)."""

    code = "conflict"
    http_status = 409


class AlreadyFinished(StoreError):
    """The execution is finished; nothing can be appended to it."""

    code = "already_finished"
    http_status = 409


class IllegalState(StoreError):
    """The event is not allowed in the execution's current state."""

    code = "illegal_state"
    http_status = 409


class UnlockedCannotBeAppended(IllegalState):
    """``Unlocked`` is only allowed while the execution is locked and active."""

    code = "unlocked_cannot_be_appended"

    def __init__(self, state: str):
        super().__init__(f"cannot append Unlocked event, execution is {state}")
        self.state = state


class VersionConflict(StoreError):
    """The optimistic version fence failed: the writer read a stale version."""

    code = "version_conflict"
    http_status = 409

    def __init__(self, expected: int, requested: int):
        super().__init__(f"version conflict: expected {expected}, requested {requested}")
        self.expected = expected
        self.requested = requested


class LockLost(StoreError):
    """The writer's lock (run id + lock generation) is no longer the execution's current lock."""

    code = "lock_lost"
    http_status = 409


class StubConflict(StoreError):
    """The stubbed execution already finished with a different value."""

    code = "stub_conflict"
    http_status = 409


class Timeout(StoreError):
    """A wait (for a result or a response) ended before anything arrived."""

    code = "timeout"
    http_status = 408
